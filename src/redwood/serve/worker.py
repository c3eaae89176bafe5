"""The server's single generation worker: one thread owns the engine and serves a bounded queue.

The engine runs one sequence at a time and is not thread-safe, so exactly one thread ever
touches it. HTTP handlers (on the asyncio loop) submit a `Job`; the worker steps the engine's
`Stream`, turns tokens into text deltas and posts events back to the handler's loop with
`call_soon_threadsafe`. A handler whose client went away sets `job.cancelled`; the worker
notices at the next step and closes the stream, freeing the engine for the next request.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from redwood.errors import RedwoodError
from redwood.serve.metrics import ServerMetrics
from redwood.serve.openai_requests import APIError, GenerationRequest
from redwood.serve.text_stream import STREAM_INTERVAL_S, TextStream

log = logging.getLogger("redwood.serve.app")


@dataclass
class Outcome:
    """How a finished request ended, for the response's last chunk and `usage`."""
    finish_reason: str              # "stop" (stop string or EOS) | "length"
    prompt_tokens: int
    completion_tokens: int
    speculative: dict               # the response's extra "redwood" field
    cached_tokens: int = 0          # prompt tokens reused from the prompt cache


@dataclass
class Job:
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)

    def post(self, kind: str, payload) -> None:
        """Thread-safe: hand an event ("text", str) | ("done", Outcome) | ("error", APIError)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:        # the handler's loop is gone (server shutting down)
            self.cancelled.set()


class QueueFull(Exception):
    pass


def enqueue(jobs: queue.Queue, job: Job, metrics) -> None:
    """Put `job` on a bounded queue (QueueFull when it is full: the caller answers 429) and
    publish the queue length."""
    try:
        jobs.put_nowait(job)
    except queue.Full:
        raise QueueFull() from None
    finally:
        metrics.queue_length.set(jobs.qsize())


class GenerationWorker:
    """Owns the engine; `submit` enqueues (or raises QueueFull), one thread generates."""

    def __init__(self, engine, tokenizer, method: str, max_queue: int, metrics: ServerMetrics,
                 drafting_for_temperature=None, stream_interval: float = STREAM_INTERVAL_S):
        self.engine, self.tokenizer, self.method, self.metrics = engine, tokenizer, method, metrics
        self.stream_interval = stream_interval       # serve/text_stream.py
        # temperature -> (Tree, draft_confidence), or None for the engine's defaults
        self.drafting_for_temperature = drafting_for_temperature
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.thread: threading.Thread | None = None
        self.current: Job | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._serve_forever, name="redwood-engine",
                                       daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self.thread is None:
            return
        if self.current is not None:
            self.current.cancelled.set()
        while True:             # drop waiting jobs so the sentinel fits; their handlers see 503
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.post("error", APIError(503, "the server is shutting down", type="server_error"))
        self.queue.put(None)
        self.thread.join(timeout)
        self.thread = None

    def submit(self, job: Job) -> None:
        enqueue(self.queue, job, self.metrics)

    def _serve_forever(self) -> None:
        while True:
            job = self.queue.get()
            self.metrics.queue_length.set(self.queue.qsize())
            if job is None:
                return
            if job.cancelled.is_set():
                continue
            self.current = job
            self.metrics.in_progress.set(1)
            try:
                self._run(job)
            except (RedwoodError, ValueError) as exc:   # the engine refused this request
                job.post("error", APIError(400, str(exc)))
            except Exception as exc:                    # a bug or an engine failure: log, go on
                log.exception("generation failed")
                job.post("error", APIError(500, f"generation failed: {type(exc).__name__}: {exc}",
                                           type="server_error"))
            finally:
                self.current = None
                self.metrics.in_progress.set(0)

    def _drafting(self, temperature: float) -> dict:
        if self.drafting_for_temperature is None:
            return {}
        tree, draft_confidence = self.drafting_for_temperature(temperature)
        return {"tree": tree, "draft_confidence": draft_confidence}

    def _run(self, job: Job) -> None:
        import torch

        req, params = job.request, job.request.sampling
        self.metrics.prompt_tokens.inc(len(req.prompt_ids))
        stream = self.engine.stream(
            torch.tensor([req.prompt_ids], dtype=torch.long), params.max_new_tokens,
            temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            seed=params.seed, method=self.method, cache_prompt=req.cache_prompt,
            ngram_memory=req.ngram_memory,
            **self._drafting(params.temperature))
        text = TextStream(job.post, self.tokenizer, list(params.stop), live=req.stream,
                          interval=self.stream_interval)
        steps: list[int] = []           # tokens gained by each target forward
        previous = None
        try:
            for step_ids in stream:
                if job.cancelled.is_set():      # client gone (or shutdown): stop at this step
                    job.post("error", APIError(503, "the request was cancelled",
                                               type="server_error", code="cancelled"))
                    return
                step_ids = list(step_ids)[: params.max_new_tokens - text.n_tokens]
                now = time.perf_counter()
                if previous is None and step_ids:
                    self.metrics.ttft.observe(now - job.arrived)
                since_previous = None if previous is None else now - previous
                self.metrics.observe_step(len(step_ids), since_previous)
                previous = now
                steps.append(len(step_ids))
                if not text.add(step_ids):  # a stop string; otherwise let the engine end by
                    break                   # itself, which sets stream.result (max_tokens, EOS)
        finally:
            stream.close()
        text.finish()
        job.post("done", self._outcome(req, text, steps, getattr(stream, "result", None)))

    def _outcome(self, req: GenerationRequest, text: TextStream, steps: list[int],
                 result) -> Outcome:
        """Usage and speculative stats. Counted from the steps this request saw, because a
        stream closed early (stop string) has no GenerationResult."""
        length_hit = not text.stopped and text.n_tokens >= req.sampling.max_new_tokens
        forwards = len(steps)
        depth_reached = [sum(1 for n in steps if n > d) for d in range(1, max(steps, default=1))]
        speculative = {
            "method": self.method, "target_forwards": forwards,
            "tokens_per_target_forward": round(sum(steps) / forwards, 4) if forwards else 0.0,
            "acceptance_by_depth": [round(c / forwards, 4) for c in depth_reached]}
        if result is not None:
            speculative.update(prefill_seconds=round(result.prefill_seconds, 6),
                               decode_seconds=round(result.decode_seconds, 6),
                               draft_tokens_per_step=round(result.stats.draft_tokens_per_step, 4),
                               plain_steps=result.stats.plain_steps,
                               accepted_by_source=dict(result.stats.accepted_by_source),
                               governor={k: round(v, 6) if isinstance(v, float) else v
                                         for k, v in result.stats.governor.items()},
                               predicted_vs_observed=result.stats.predicted_vs_observed(),
                               acceptance_by_match=result.stats.match_counts(),
                               draft_ratio=result.stats.draft_ratio)
            self.metrics.observe_prediction(result.stats)
            self.metrics.cached_prompt_tokens.inc(result.stats.cached_prompt_tokens)
            if req.cache_prompt:
                cells = getattr(self.engine.target_backend, "cache_length", lambda: 0)()
                self.metrics.observe_cache(1, int(result.stats.cached_prompt_tokens > 0), 0, cells)
        return Outcome(finish_reason="length" if length_hit else "stop",
                       prompt_tokens=len(req.prompt_ids), completion_tokens=text.n_tokens,
                       speculative=speculative,
                       cached_tokens=result.stats.cached_prompt_tokens if result is not None else 0)
