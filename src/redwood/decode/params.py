"""How one request samples: the single, validated record every layer passes along
(engine, CLI, server, bench, calibrate)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from redwood.errors import RedwoodError


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; top_p in (0, 1]; top_k 0 = off; seed None = fresh randomness;
    stop: strings that end the text (applied by the text layers: CLI and server)."""
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        check_sampling(self.max_new_tokens, self.temperature, self.top_p, self.top_k)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise RedwoodError(f"seed must be an integer or None, got {self.seed!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise RedwoodError("stop must be non-empty strings")
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_(self, **changes) -> "SamplingParams":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


def check_sampling(max_new_tokens, temperature, top_p, top_k) -> None:
    """Raise RedwoodError on sampling settings that are out of range."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise RedwoodError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or math.isnan(temperature) or temperature < 0 or math.isinf(temperature):
        raise RedwoodError(f"temperature must be a number >= 0, got {temperature!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not (0.0 < top_p <= 1.0):
        raise RedwoodError(f"top_p must be in (0, 1], got {top_p!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise RedwoodError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")


def check_draft_confidence(value) -> None:
    """Raise RedwoodError unless value is a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or not 0.0 <= value < 1.0:
        raise RedwoodError(f"draft_confidence must be a number in [0, 1) (0 = draft the whole "
                           f"tree), got {value!r}")
