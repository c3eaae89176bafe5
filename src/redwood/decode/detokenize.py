"""Incremental detokenisation with stop strings, for streaming text as tokens arrive.

Decoding token by token is wrong for byte-level BPE: one character can span several tokens
(the partial bytes decode to U+FFFD) and a tokenizer may merge spaces across token boundaries.
So the text is decoded with context and only the new suffix is emitted, holding back (a) a
trailing U+FFFD, which may be an incomplete UTF-8 character, and (b) any tail that could still
grow into a stop string, so a stop string never leaks to the client in pieces.

Decoding the whole generated list every step made each step cost O(length): ~0.1 ms per step at
400 tokens on a 2-core CPU, right after a decode, while llama.cpp's threads wait. So each step
decodes a window instead (the approach of TGI's and vLLM's incremental detokenisers): the tokens
since the last settled point with the step before it as context, and appends what the window's
text gained over the context's own text. A point is settled when the text there ends in a whole
character. Where a window's text does not extend its context's (a tokenizer that cleans up
spaces across tokens), that step decodes everything: `text` is decode(all ids) either way
(tests/test_detokenize.py).
"""
from __future__ import annotations

_REPLACEMENT = "\ufffd"


class IncrementalText:
    """Feed generated token ids with `add`; it returns the text that is now safe to emit.

    After a stop string appears, `stopped` is True, the text is cut just before it and
    `n_tokens` is the fewest tokens whose text contains it (the usage count), so the result
    does not depend on how many tokens a speculative step happened to yield.
    """

    def __init__(self, tokenizer, stop: list[str] | None = None, live: bool = True):
        """live=False (nobody reads the text before the end: a non-streamed answer): without
        stop strings `add` only collects ids and `finish` decodes once. Decoding every step
        and handing each piece to the event loop cost CPU that llama.cpp's threads need on a
        2-core machine; with stop strings the text is still decoded per step to find them."""
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        self.deferred = not live and not self.stop
        self.tokens: list[int] = []
        self.text = ""          # all text decoded so far (cut at the stop string once stopped)
        self.emitted = 0        # characters of self.text already returned
        self.stopped = False
        # The window: tokens[:_read] decode to _settled, which ends in a whole character;
        # tokens[_context:_read] are decoded again as the context of what follows.
        self._context = self._read = 0
        self._settled = ""
        self._decoded = 0       # tokens whose text is in self.text (hold() leaves some out)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _decode_tail(self) -> str:
        """decode(self.tokens), decoding only the window (module doc), and settling the window
        at the end when the text there ends in a whole character."""
        tokens, context, read = self.tokens, self._context, self._read
        before = self._decode(tokens[context:read]) if read > context else ""
        window = self._decode(tokens[context:])
        if window.startswith(before):
            text = self._settled + window[len(before):]
        else:                                   # not concatenative here: decode everything
            text = self._decode(tokens)
        if not text.endswith(_REPLACEMENT):
            self._settled, self._context, self._read = text, read, len(tokens)
        self._decoded = len(tokens)
        return text

    def add(self, new_ids: list[int]) -> str:
        if self.stopped or not new_ids:
            return ""
        if self.deferred:
            self.tokens.extend(int(t) for t in new_ids)
            return ""
        previous_count = self._decoded
        self.tokens.extend(int(t) for t in new_ids)
        self.text = self._decode_tail()
        # A trailing U+FFFD may be half a character that the next token completes: neither
        # emit it nor match stop strings against it yet.
        stable = len(self.text)
        while stable > self.emitted and self.text[stable - 1] == _REPLACEMENT:
            stable -= 1
        if self._stop_at(stable, previous_count):
            return self._take(len(self.text))
        return self._take(self._hold_back_stop_prefix(stable))

    def hold(self, new_ids: list[int]) -> None:
        """Collect ids without decoding them (a step whose text nobody needs yet): the next
        `add` or `finish` decodes them. Only without stop strings, which every step must be
        searched for."""
        if self.stop:
            raise ValueError("IncrementalText.hold: with stop strings every step is decoded")
        if not self.stopped:
            self.tokens.extend(int(t) for t in new_ids)

    def finish(self) -> str:
        """The rest of the text at the end of generation (nothing more is held back)."""
        if self.deferred:
            self.text = self._decode(self.tokens)
        elif self._decoded < len(self.tokens) and not self.stopped:
            self.text = self._decode_tail()
        if not self.stopped:
            self._stop_at(len(self.text), 0)
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        delta = self.text[self.emitted:end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return delta

    def _stop_at(self, end: int, previous_count: int) -> bool:
        """Cut the text at the first stop string within text[:end], if any."""
        # Text held back never contains the start of a stop string that was emitted, so
        # searching from the emitted position finds every new match.
        window = self.text[:end]
        hits = [i for i in (window.find(s, self.emitted) for s in self.stop) if i >= 0]
        if not hits:
            return False
        self.stopped = True
        self.text = self.text[:min(hits)]
        self._trim_tokens_to_stop(previous_count)
        return True

    def _hold_back_stop_prefix(self, end: int) -> int:
        """End of the emittable text: before any tail that could grow into a stop string."""
        longest = max((len(s) for s in self.stop), default=0)
        for held in range(min(end - self.emitted, longest), 0, -1):
            tail = self.text[end - held:end]
            if any(s.startswith(tail) for s in self.stop):
                return end - held
        return end

    def _trim_tokens_to_stop(self, previous_count: int) -> None:
        # The stop string was not in the first previous_count tokens; find the first prefix
        # of the new ones whose text contains it. Bounded by the tokens of one step.
        for count in range(previous_count + 1, len(self.tokens)):
            prefix_text = self._decode(self.tokens[:count])
            if any(s in prefix_text[self.emitted:] for s in self.stop):
                del self.tokens[count:]
                return
