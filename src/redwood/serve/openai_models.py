"""The OpenAI request bodies redwood accepts, as pydantic models: types, ranges, defaults, and
the fields it refuses.

Models are strict: "10" is not 10 and true is not 1, since a client sending those has a bug
it should hear about. `null` means the field's default (OpenAI clients send explicit nulls).
Fields redwood does not know are ignored, as OpenAI's own server ignores them; fields it
knows but does not implement are refused when they ask for anything but the default, so a
client never silently receives something it did not ask for. Checks that need the model
(context length, vocabulary) are not here: see openai_requests.py.

Errors that concern a field raise `PydanticCustomError`s whose `ctx["param"]` names it when
pydantic's own location cannot (model-level checks); openai_requests.py turns the first
error into the OpenAI error body.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, WrapValidator,
                      field_validator, model_validator)
from pydantic_core import PydanticCustomError

MAX_STOP_STRINGS = 16

# field -> values that mean "not used" (anything else is refused as unsupported).
UNSUPPORTED = {
    "n": (None, 1), "best_of": (None, 1), "logprobs": (None, False, 0), "top_logprobs": (None, 0),
    "echo": (None, False), "suffix": (None, ""), "logit_bias": (None, {}),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "tools": (None, []),
    "functions": (None, []), "tool_choice": (None, "none"), "function_call": (None, "none"),
    "parallel_tool_calls": (None, False, True), "audio": (None,), "modalities": (None, ["text"]),
    "prediction": (None,), "response_format": (None, {"type": "text"}),
}
COMPLETION_ONLY = frozenset({"prompt", "best_of", "echo", "suffix"})
CHAT_ONLY = frozenset({"messages", "max_completion_tokens", "top_logprobs", "tools", "functions",
                       "tool_choice", "function_call", "parallel_tool_calls", "audio",
                       "modalities", "prediction", "response_format"})


def _explained(description: str) -> WrapValidator:
    """Replace pydantic's errors for a union (one per member: "should be a valid string",
    "should be a valid list", ...) by one sentence saying what the field accepts."""
    def validate(value, handler):
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("invalid_value", description) from None
    return WrapValidator(validate)


NonEmptyStr = Annotated[str, Field(min_length=1)]
MaxTokens = Annotated[int, Field(ge=1)]
Stop = Annotated[
    NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=MAX_STOP_STRINGS)],
    _explained(f"must be a non-empty string or a list of at most {MAX_STOP_STRINGS} "
               "non-empty strings")]
Prompt = Annotated[
    NonEmptyStr | Annotated[list[int], Field(min_length=1)],
    _explained("must be a non-empty string or a non-empty list of token ids")]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[str | list[TextPart],
                       _explained("must be a string or a list of text parts")]


class StreamOptions(_Strict):
    include_usage: bool = False


class _Request(_Strict):
    """What both endpoints share. Unknown fields are kept (extra="allow") only so that the
    unsupported ones among them can be checked; nothing else reads them."""
    model_config = ConfigDict(strict=True, extra="allow")
    other_endpoint: ClassVar[tuple[str, frozenset]]     # (its path, the fields only it takes)

    model: str | None = None
    max_tokens: MaxTokens | None = None
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0      # not OpenAI's; vLLM-style clients send it
    seed: int | None = None
    stop: Stop | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    cache_prompt: bool = True       # llama-server's: false = prefill the whole prompt afresh
    ngram_memory: bool = True       # redwood's: false = no n-gram drafts from earlier answers

    @model_validator(mode="before")
    @classmethod
    def _defaults_and_endpoint(cls, body: Any) -> Any:
        if not isinstance(body, dict):
            return body                 # pydantic reports it
        body = {name: value for name, value in body.items() if value is not None}
        path, fields = cls.other_endpoint
        for name in body:
            if name in fields:
                raise PydanticCustomError("wrong_endpoint", "this field belongs to {endpoint}",
                                          {"param": name, "endpoint": path})
        return body

    @model_validator(mode="after")
    def _refuse_unsupported(self):
        given = {**(self.model_extra or {}), "n": self.n}
        for name, neutral in UNSUPPORTED.items():
            value = given.get(name)
            if value is not None and value not in neutral:
                what = "only n=1 is supported" if name == "n" else "not supported by redwood"
                raise PydanticCustomError("unsupported_parameter", "{what} (got {got})",
                                          {"param": name, "what": what, "got": repr(value)})
        return self

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class CompletionRequest(_Request):
    other_endpoint = ("/v1/chat/completions", CHAT_ONLY)
    prompt: Prompt

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value):
        """OpenAI's prompt may be a batch; redwood answers one prompt per request, so a
        batch of one is unwrapped and a longer one refused."""
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
            return value[0]
        if isinstance(value, list) and len(value) > 1 \
                and any(isinstance(item, (str, list)) for item in value):
            raise PydanticCustomError("invalid_value", "only one prompt per request is supported")
        return value


class ChatRequest(_Request):
    other_endpoint = ("/v1/completions", COMPLETION_ONLY)
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: MaxTokens | None = None      # the newer name of max_tokens

    def conversation(self) -> list[dict]:
        """The messages as the chat template takes them: text content, and "developer"
        (OpenAI's newer name) mapped to "system", the role templates know."""
        return [{"role": "system" if m.role == "developer" else m.role,
                 "content": m.content if isinstance(m.content, str)
                 else "".join(part.text for part in m.content)} for m in self.messages]
