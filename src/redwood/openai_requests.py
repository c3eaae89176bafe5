"""OpenAI-style request validation for the server: JSON body -> `GenerationRequest`.

Every problem raises `APIError` carrying an OpenAI error body
(`{"error": {"message", "type", "param", "code"}}`) that names the offending field.
Fields redwood does not implement get a 400 when they ask for something other than the
default, so a client never silently receives something it did not ask for.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_STOP_STRINGS = 16


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


@dataclass
class GenerationRequest:
    """A validated request, ready for the engine."""
    kind: str                       # "completion" | "chat"
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False     # stream_options.include_usage


# field -> values that mean "not used" (anything else is refused as unsupported).
_UNSUPPORTED = {
    "n": (None, 1), "best_of": (None, 1), "logprobs": (None, False, 0), "top_logprobs": (None, 0),
    "echo": (None, False), "suffix": (None, ""), "logit_bias": (None, {}),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "tools": (None, []),
    "functions": (None, []), "tool_choice": (None, "none"), "function_call": (None, "none"),
    "parallel_tool_calls": (None, False, True), "audio": (None,), "modalities": (None, ["text"]),
    "prediction": (None,), "response_format": (None, {"type": "text"}),
}
_COMPLETION_ONLY = {"prompt", "best_of", "echo", "suffix"}
_CHAT_ONLY = {"messages", "max_completion_tokens", "top_logprobs", "tools", "functions",
              "tool_choice", "function_call", "parallel_tool_calls", "audio", "modalities",
              "prediction", "response_format"}


def _bad(param: str, message: str, code: str | None = None) -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code=code)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_unsupported(body: dict, kind: str) -> None:
    wrong_endpoint = _CHAT_ONLY if kind == "completion" else _COMPLETION_ONLY
    for name in body:
        if name in wrong_endpoint and body[name] is not None:
            endpoint = "/v1/chat/completions" if kind == "completion" else "/v1/completions"
            raise _bad(name, f"this field belongs to {endpoint}")
    for name, neutral in _UNSUPPORTED.items():
        value = body.get(name)
        if value is None:
            continue
        if name == "n" and not _is_int(value):
            raise _bad("n", f"must be an integer, got {value!r}")
        if value not in neutral:
            what = "only n=1 is supported" if name == "n" else "not supported by redwood"
            raise _bad(name, f"{what} (got {value!r})", code="unsupported_parameter")


def _number(body, name, default, low, high, low_open=False):
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value) or not math.isfinite(value):
        raise _bad(name, f"must be a finite number, got {value!r}")
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise _bad(name, f"must be in {bracket}{low}, {high}], got {value!r}")
    return float(value)


def _stop_strings(body) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("stop", "must be a string or a list of strings")
    if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
        raise _bad("stop", f"give 1 to {MAX_STOP_STRINGS} non-empty stop strings")
    return stops


def _max_tokens(body, kind, prompt_len, context, default_max_tokens) -> int:
    newer_name = kind == "chat" and body.get("max_completion_tokens") is not None
    name = "max_completion_tokens" if newer_name else "max_tokens"
    value = body.get(name)
    prompt_param = "prompt" if kind == "completion" else "messages"
    room = context - prompt_len
    if room < 1:
        raise APIError(400, f"{prompt_param}: the prompt has {prompt_len} tokens; the model's "
                       f"context is {context} tokens, leaving no room to generate", prompt_param,
                       code="context_length_exceeded")
    if value is None:
        return min(default_max_tokens, room)
    if not _is_int(value):
        raise _bad(name, f"must be an integer, got {value!r}")
    if value < 1:
        raise _bad(name, f"must be at least 1, got {value}")
    if value > room:
        raise APIError(400, f"{name}: prompt ({prompt_len} tokens) + {name} ({value}) exceeds the "
                       f"model's context of {context} tokens; ask for at most {room}", name,
                       code="context_length_exceeded")
    return value


def _sampling(body) -> dict:
    top_k = body.get("top_k")   # not OpenAI's, but vLLM-style clients send it via extra_body
    if top_k is not None and (not _is_int(top_k) or top_k < 0):
        raise _bad("top_k", f"must be an integer >= 0, got {top_k!r}")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise _bad("seed", f"must be an integer, got {seed!r}")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream", f"must be true or false, got {stream!r}")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict)
                                or not isinstance(options.get("include_usage", False), bool)):
        raise _bad("stream_options", "must be an object like {\"include_usage\": true}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", f"must be a string, got {model!r}")
    return dict(temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
                top_k=top_k or 0, seed=seed, stream=bool(stream), stop=_stop_strings(body),
                include_usage=bool(stream and options and options.get("include_usage")))


def _prompt_ids(body, tokenizer, vocab_size) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]              # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("prompt", "must not be empty")
        return list(tokenizer(prompt).input_ids)
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        if not all(0 <= t < vocab_size for t in prompt):
            raise _bad("prompt", f"token ids must be in [0, {vocab_size})")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise _bad("prompt", "only one prompt per request is supported")
    raise _bad("prompt", "must be a non-empty string or a non-empty list of token ids")


def _message_text(content, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise _bad(f"messages[{index}].content", "must be a string or a list of text parts")


def _chat_ids(body, tokenizer) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list of {role, content} objects")
    clean = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _bad(f"messages[{i}]", "must be an object with role and content")
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant"):
            raise _bad(f"messages[{i}].role",
                       f"must be system, developer, user or assistant, got {role!r}")
        clean.append({"role": "system" if role == "developer" else role,
                      "content": _message_text(message.get("content"), i)})
    try:
        text = tokenizer.apply_chat_template(clean, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # jinja raises its own errors for conversations a template refuses
        raise _bad("messages", f"the tokenizer's chat template refused them: {exc}") from exc
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def parse_request(body, kind: str, tokenizer, context: int, vocab_size: int,
                  default_max_tokens: int) -> GenerationRequest:
    """Validate an OpenAI completion (`kind="completion"`) or chat request body."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    _check_unsupported(body, kind)
    sampling = _sampling(body)
    ids = _prompt_ids(body, tokenizer, vocab_size) if kind == "completion" \
        else _chat_ids(body, tokenizer)
    if not ids:
        raise _bad("prompt" if kind == "completion" else "messages", "tokenizes to nothing")
    max_tokens = _max_tokens(body, kind, len(ids), context, default_max_tokens)
    return GenerationRequest(kind=kind, prompt_ids=ids, max_tokens=max_tokens, **sampling)
