"""OpenAI-compatible HTTP server over the engine (FastAPI + uvicorn).

    app = create_app(engine, tokenizer, ServerConfig(model_name="qwen2.5-coder"))
    run_server(app, ServerConfig(...))      # or uvicorn.Server(...) in tests

Endpoints: POST /v1/completions, POST /v1/chat/completions (OpenAI request/response shapes,
`stream` as server-sent events ending in `data: [DONE]`, `usage`, and an extra `redwood` field
with the speculative stats), GET /v1/models, GET /health, GET /metrics (Prometheus text).
Generation happens in one worker thread (worker.py); requests wait in a bounded queue
and get a 429 when it is full.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from redwood.serve.metrics import ServerMetrics
from redwood.serve.openai_requests import APIError, GenerationRequest, parse_request
from redwood.serve.text_stream import STREAM_INTERVAL_S
from redwood.serve.worker import GenerationWorker, Job, Outcome, QueueFull

_DISCONNECT_POLL_SECONDS = 0.25     # how often a waiting handler checks its client is still there


@dataclass
class ServerConfig:
    model_name: str = "redwood"             # the id in /v1/models and in responses
    method: str = "sequoia"                 # engine method for every request
    max_queue: int = 16                     # waiting requests beyond the one generating
    api_key: str | None = None              # when set, every endpoint but /health needs it
    context_length: int | None = None       # default: model positions minus the tree depth
    default_max_tokens: int = 256           # when a request gives no max_tokens
    host: str = "127.0.0.1"
    port: int = 8000
    # Optional per-request drafting: temperature -> (Tree, draft_confidence), a tuned
    # bundle's nearest entry; None = the engine's own tree and threshold for every request.
    drafting_for_temperature: object = None
    # Streamed text goes out at most this often, the first text at once (serve/text_stream.py);
    # 0 = every step.
    stream_interval: float = STREAM_INTERVAL_S

    def __post_init__(self):
        if self.max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {self.max_queue}")
        if self.default_max_tokens < 1:
            raise ValueError(
                f"default_max_tokens must be at least 1, got {self.default_max_tokens}")
        if not 0 <= self.stream_interval <= 10:
            raise ValueError(f"stream_interval (--stream-interval) must be in [0, 10] seconds, "
                             f"got {self.stream_interval}")


def _model_limits(engine, tokenizer, config: ServerConfig) -> tuple[int, int]:
    """(context length, vocabulary size) that requests are checked against.

    The engine needs room for the prompt, the new tokens and one tree beyond them, so the
    usable context is the model's positions minus the tree's depth."""
    target = getattr(engine, "target", None)
    target_config = getattr(target, "config", None)
    vocab = getattr(target_config, "vocab_size", None) or len(tokenizer)
    context = config.context_length
    if context is None:
        positions = getattr(engine, "max_positions", None) or getattr(
            target_config, "max_position_embeddings", None)
        tree = getattr(engine, "tree", None)
        if not positions:
            raise ValueError(
                "cannot tell the model's context length: set ServerConfig.context_length")
        context = positions - (tree.num_levels if tree is not None else 0)
    return int(context), int(vocab)


class _ClientGone(Exception):
    pass


async def _next_event(job: Job, request) -> tuple[str, object]:
    """Wait for the worker's next event; if the client disconnects meanwhile, cancel the job."""
    while True:
        try:
            return await asyncio.wait_for(job.events.get(), _DISCONNECT_POLL_SECONDS)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancelled.set()
                raise _ClientGone() from None


def _usage(outcome: Outcome) -> dict:
    return {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": outcome.completion_tokens,
            "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens}}


class _Responder:
    """OpenAI response and chunk shapes for one request."""

    def __init__(self, req: GenerationRequest, model_name: str):
        self.req, self.model = req, model_name
        self.chat = req.kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _envelope(self, choices: list, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (
            ".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": choices}

    def _choice(self, text: str | None, finish: str | None, chunk: bool,
                role: bool = False) -> dict:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if chunk:
            delta = ({"role": "assistant", "content": ""} if role else
                     {"content": text} if text is not None else {})
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": None, "finish_reason": finish}

    def full(self, text: str, outcome: Outcome) -> dict:
        body = self._envelope([self._choice(text, outcome.finish_reason, chunk=False)], chunk=False)
        body["usage"] = _usage(outcome)
        body["redwood"] = outcome.speculative
        return body

    def first_chunk(self) -> dict | None:
        return self._envelope([self._choice(None, None, chunk=True, role=True)], True) \
            if self.chat else None

    def text_chunk(self, text: str) -> dict:
        return self._envelope([self._choice(text, None, chunk=True)], chunk=True)

    def final_chunks(self, outcome: Outcome) -> list[dict]:
        last = self._envelope([self._choice(None, outcome.finish_reason, chunk=True)], chunk=True)
        last["redwood"] = outcome.speculative
        if not self.req.include_usage:
            return [last]
        usage = self._envelope([], chunk=True)
        usage["usage"] = _usage(outcome)
        return [last, usage]


def _sse(payload) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class _Service:
    """What the routes share: the worker, the metrics and the request limits."""

    def __init__(self, engine, tokenizer, config: ServerConfig):
        self.tokenizer, self.config = tokenizer, config
        self.context, self.vocab = _model_limits(engine, tokenizer, config)
        self.metrics = ServerMetrics()
        if getattr(engine, "batched", False):     # a BatchScheduler (llama.cpp, --max-batch)
            from redwood.serve.batch_worker import BatchWorker

            self.worker = BatchWorker(engine, tokenizer, config.method, config.max_queue,
                                      self.metrics, config.stream_interval)
        else:
            self.worker = GenerationWorker(engine, tokenizer, config.method, config.max_queue,
                                           self.metrics, config.drafting_for_temperature,
                                           config.stream_interval)

    def authorize(self, request: Request) -> None:
        if self.config.api_key is None:
            return
        header = request.headers.get("authorization", "")
        token = header[7:] if header[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), self.config.api_key.encode()):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                           type="authentication_error", code="invalid_api_key")

    def error_response(self, err: APIError, endpoint: str | None = None) -> JSONResponse:
        if endpoint:
            self.metrics.count_request(endpoint, err.status)
        return JSONResponse(err.body(), status_code=err.status)

    async def generate(self, request: Request, kind: str):
        """Validate, queue, then answer in one piece or as a stream. The response starts only
        once the worker produced something, so a request refused by the engine still gets a
        proper 4xx/5xx status instead of a 200 stream holding an error."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise APIError(400, "the request body is not valid JSON") from None
        req = parse_request(body, kind, self.tokenizer, self.context, self.vocab,
                            self.config.default_max_tokens)
        job = Job(request=req, loop=asyncio.get_running_loop())
        try:
            self.worker.submit(job)
        except QueueFull:
            raise APIError(429, f"the server is busy: {self.config.max_queue} requests are "
                           "already waiting; retry later", type="rate_limit_error",
                           code="queue_full") from None
        responder = _Responder(req, self.config.model_name)
        endpoint = request.url.path
        try:
            first = await _next_event(job, request)
        except _ClientGone:
            self.metrics.count_request(endpoint, 499)
            return Response(status_code=499)
        if first[0] == "error":
            raise first[1]
        if req.stream:
            return StreamingResponse(self._stream_events(job, first, responder, endpoint),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await self._full_response(job, request, first, responder, endpoint)

    async def _full_response(self, job, request, event, responder, endpoint):
        pieces = []
        try:
            while event[0] == "text":
                pieces.append(event[1])
                event = await _next_event(job, request)
        except _ClientGone:
            self.metrics.count_request(endpoint, 499)
            return Response(status_code=499)
        if event[0] == "error":
            raise event[1]
        self.metrics.count_request(endpoint, 200)
        return JSONResponse(responder.full("".join(pieces), event[1]))

    async def _stream_events(self, job, event, responder, endpoint):
        # Starlette cancels this generator when the client disconnects; `finally` then tells
        # the worker, which closes the engine's stream at its next step.
        status = 499        # unless we reach the end, the client went away
        try:
            opening = responder.first_chunk()
            if opening is not None:
                yield _sse(opening)
            while True:
                kind, payload = event
                if kind == "text":
                    yield _sse(responder.text_chunk(payload))
                elif kind == "done":
                    for chunk in responder.final_chunks(payload):
                        yield _sse(chunk)
                    status = 200
                    break
                else:       # an error after the 200 header went out: say so in the stream
                    status = payload.status
                    yield _sse(payload.body())
                    break
                event = await job.events.get()
            yield "data: [DONE]\n\n"
        finally:
            job.cancelled.set()     # no-op when finished; frees the engine when the client left
            self.metrics.count_request(endpoint, status)


def create_app(engine, tokenizer, config: ServerConfig | None = None) -> FastAPI:
    """A FastAPI app serving `engine` (a redwood.Engine) with `tokenizer`.

    The generation worker thread starts and stops with the app's lifespan; `app.state.metrics`
    and `app.state.worker` are exposed for embedding and tests."""
    service = _Service(engine, tokenizer, config or ServerConfig())
    config = service.config

    @asynccontextmanager
    async def lifespan(app):
        service.worker.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, service.worker.stop)

    app = FastAPI(title="redwood", lifespan=lifespan)
    app.state.metrics, app.state.worker, app.state.config = service.metrics, service.worker, config
    auth = [Depends(service.authorize)]

    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError):
        return service.error_response(err, request.url.path)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return service.error_response(APIError(exc.status_code, str(exc.detail), type=kind))

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": config.model_name,
                "queue_length": service.worker.queue.qsize()}

    @app.get("/v1/models", dependencies=auth)
    async def models():
        return {"object": "list", "data": [{"id": config.model_name, "object": "model",
                                            "created": 0, "owned_by": "redwood"}]}

    @app.get("/metrics", dependencies=auth)
    async def prometheus_metrics():
        return Response(service.metrics.render(), media_type=service.metrics.content_type)

    @app.post("/v1/completions", dependencies=auth)
    async def completions(request: Request):
        return await service.generate(request, "completion")

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(request: Request):
        return await service.generate(request, "chat")

    return app


def run_server(app, config: ServerConfig) -> None:
    """Serve `app` with uvicorn until interrupted."""
    import uvicorn

    # A bounded graceful shutdown: on Ctrl-C, streams still open get a few seconds to end.
    uvicorn.run(app, host=config.host, port=config.port, log_level="info",
                timeout_graceful_shutdown=5)
