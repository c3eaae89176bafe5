"""A request's text on its way to its HTTP handler: decoded and posted at a steady pace.

Every post wakes the event loop (a self-pipe write), which then formats an SSE chunk and
writes it to the client's socket. On a 2-core CPU llama.cpp's two threads hold both cores, so
that work either stalls the worker (the loop takes the GIL right after the post) or the next
decode: measured in `redwood serve`, 0.35-0.45 ms per post, about 1 % of a 35 ms step, and the
event loop thread's CPU another 0.46 ms per step (benchmarks/server_path.py). So the first text
goes out at once (time to first token unchanged), later text at most every `interval` seconds,
and whatever is held at the end with the last post. Steps in between only collect their ids;
with stop strings they are decoded every step all the same, so a stop string still ends the
request on the step that produced it.

interval 0 posts every step that produced text (llama-server's way); `redwood serve
--stream-interval`.
"""
from __future__ import annotations

import time

from redwood.decode.detokenize import IncrementalText

STREAM_INTERVAL_S = 0.05     # at most ~20 chunks a second: steady to read, half the posts of a
                             # 35 ms CPU step, a fifth of a 10 ms GPU step


class TextStream:
    """Feed each step's token ids with `add`; `finish` posts the rest. `post(kind, payload)`
    is the job's thread-safe event hand-off (serve/worker.py Job.post)."""

    def __init__(self, post, tokenizer, stop: list[str], live: bool,
                 interval: float = STREAM_INTERVAL_S, clock=time.perf_counter):
        if not interval >= 0:
            raise ValueError(f"stream interval must be >= 0 seconds, got {interval}")
        self.post, self.interval, self.clock = post, float(interval), clock
        self.text = IncrementalText(tokenizer, stop, live=live)
        self._held: list[str] = []
        self._posted: float | None = None      # clock() at the last post (None: nothing yet)

    @property
    def stopped(self) -> bool:
        return self.text.stopped

    @property
    def n_tokens(self) -> int:
        return self.text.n_tokens

    def add(self, ids: list[int]) -> bool:
        """One step's tokens; False once a stop string ended the text."""
        now = self.clock()
        due = self._posted is None or now - self._posted >= self.interval
        if not due and not self.text.stop:
            self.text.hold(ids)                 # decoded with the next step that posts
            return True
        delta = self.text.add(ids)
        if delta:
            self._held.append(delta)
        if due and self._held:
            self.post("text", "".join(self._held))
            self._held, self._posted = [], now
        return not self.text.stopped

    def finish(self) -> None:
        """The request ended: post everything not posted yet (text held back included)."""
        rest = "".join(self._held) + self.text.finish()
        self._held = []
        if rest:
            self.post("text", rest)
