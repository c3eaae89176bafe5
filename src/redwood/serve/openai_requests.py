"""OpenAI-style request validation for the server: JSON body -> `GenerationRequest`.

The body's shape is checked by the pydantic models of openai_models.py; what needs the model
(tokenising the prompt, the context length, the vocabulary) is checked here. Every problem
raises `APIError` carrying an OpenAI error body (`{"error": {"message", "type", "param",
"code"}}`) that names the offending field.
"""
from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from redwood.decode.params import SamplingParams
from redwood.errors import RedwoodError
from redwood.prompts import encode_chat, encode_text
from redwood.serve.openai_models import ChatRequest, CompletionRequest

_GOT_LIMIT = 80         # characters of a refused value quoted back in an error message


class APIError(Exception):
    """An error answered to the client as an OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type, self.code = type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request, ready for the engine."""
    kind: str                       # "completion" | "chat"
    prompt_ids: list[int]
    sampling: SamplingParams        # max_new_tokens is the request's max_tokens
    stream: bool = False
    include_usage: bool = False     # stream_options.include_usage
    cache_prompt: bool = True       # llama-server's field: reuse the cached prompt prefix
    ngram_memory: bool = True       # draft from (and feed) the n-gram memory of earlier answers


def _bad(param: str, message: str, code: str | None = None) -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code=code)


def _param(loc: tuple) -> str:
    """pydantic's error location as the JSON path clients know: messages[0].content."""
    path = str(loc[0])
    for part in loc[1:]:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _from_validation(exc: ValidationError) -> APIError:
    """The first pydantic error as an OpenAI error (OpenAI reports one problem at a time)."""
    error = exc.errors(include_url=False)[0]
    context = error.get("ctx") or {}
    param = context.get("param") or (_param(error["loc"]) if error["loc"] else None)
    message = error["msg"][:1].lower() + error["msg"][1:]     # it follows "param: "
    # Quote the refused value, except where the error is about the whole body (a missing
    # field) or already says what it got.
    if error["loc"] and error["type"] not in ("missing", "unsupported_parameter"):
        got = repr(error["input"])
        message += f", got {got if len(got) <= _GOT_LIMIT else got[:_GOT_LIMIT] + '...'}"
    code = "unsupported_parameter" if error["type"] == "unsupported_parameter" else None
    if param is None:
        return APIError(400, message)
    return _bad(param, message, code)


def _completion_ids(request: CompletionRequest, tokenizer, vocab_size: int) -> list[int]:
    if isinstance(request.prompt, str):
        return encode_text(tokenizer, request.prompt)
    if not all(0 <= t < vocab_size for t in request.prompt):
        raise _bad("prompt", f"token ids must be in [0, {vocab_size})")
    return list(request.prompt)


def _chat_ids(request: ChatRequest, tokenizer) -> list[int]:
    try:
        return encode_chat(tokenizer, request.conversation())
    except RedwoodError as exc:
        raise _bad("messages", str(exc)) from None
    except Exception as exc:  # jinja raises its own errors for conversations a template refuses
        raise _bad("messages", f"the tokenizer's chat template refused them: {exc}") from exc


def _max_tokens(request, kind: str, prompt_len: int, context: int,
                default_max_tokens: int) -> int:
    """max_tokens (or chat's newer max_completion_tokens), checked against the room the
    prompt leaves in the context; the default when the request gives none."""
    newer = kind == "chat" and request.max_completion_tokens is not None
    name = "max_completion_tokens" if newer else "max_tokens"
    value = getattr(request, name)
    prompt_param = "prompt" if kind == "completion" else "messages"
    room = context - prompt_len
    if room < 1:
        raise APIError(400, f"{prompt_param}: the prompt has {prompt_len} tokens; the model's "
                       f"context is {context} tokens, leaving no room to generate", prompt_param,
                       code="context_length_exceeded")
    if value is None:
        return min(default_max_tokens, room)
    if value > room:
        raise APIError(400, f"{name}: prompt ({prompt_len} tokens) + {name} ({value}) exceeds the "
                       f"model's context of {context} tokens; ask for at most {room}", name,
                       code="context_length_exceeded")
    return value


def parse_request(body, kind: str, tokenizer, context: int, vocab_size: int,
                  default_max_tokens: int) -> GenerationRequest:
    """Validate an OpenAI completion (`kind="completion"`) or chat request body."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        request = (CompletionRequest if kind == "completion" else ChatRequest).model_validate(body)
    except ValidationError as exc:
        raise _from_validation(exc) from None
    if kind == "completion":
        ids = _completion_ids(request, tokenizer, vocab_size)
    else:
        ids = _chat_ids(request, tokenizer)
    if not ids:
        raise _bad("prompt" if kind == "completion" else "messages", "tokenizes to nothing")
    max_tokens = _max_tokens(request, kind, len(ids), context, default_max_tokens)
    # The request models' ranges lie within SamplingParams', so this cannot raise.
    sampling = SamplingParams(max_new_tokens=max_tokens, temperature=request.temperature,
                              top_p=request.top_p, top_k=request.top_k, seed=request.seed,
                              stop=request.stop_strings())
    include_usage = request.stream and request.stream_options is not None \
        and request.stream_options.include_usage
    return GenerationRequest(kind=kind, prompt_ids=ids, sampling=sampling,
                             stream=request.stream, include_usage=include_usage,
                             cache_prompt=request.cache_prompt,
                             ngram_memory=request.ngram_memory)
