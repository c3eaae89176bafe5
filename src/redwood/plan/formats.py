"""Acceptance vectors and latency profiles: load, save, validate (JSON formats of docs/design.md §7).

acceptance: {"format": 1, "kind": "acceptance", "p": [p_1, ..., p_W], "temperature": T,
             "top_p": P, "top_k": K|null, "draft": str, "target": str, "dataset": str, "steps": N}
    p is *unconditional*: p_k = probability that the rank-k child is the accepted one,
    so p >= 0 and sum(p) <= 1.
profile:    {"format": 1, "kind": "profile", "device": str, "dtype": str, "context": C,
             "target_ms": {"1": ..., "2": ..., ...}, "draft_ms": {"1": ..., ...}}
    target_ms[n]: one target forward over n tree tokens; draft_ms[w]: one draft forward over
    a level of w tokens. Both need n = 1 and positive times. Extra keys (e.g. "source") are kept.
    Optional "target_ms_by_context": {"128": {"1": ...}, "1024": {...}}: target_ms measured on
    top of that many cached tokens (files without it load with None).
Pure numpy; no torch.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from redwood.errors import RedwoodError
from redwood.plan.tree import read_json

FORMAT = 1
SUM_TOLERANCE = 1e-6


# --- acceptance vectors ----------------------------------------------------------------

def validate_p(p, where: str = "acceptance") -> np.ndarray:
    """Check an unconditional acceptance vector; return it as a float64 array [W]."""
    arr = _number_array(p, f"{where}: p")
    if np.any(arr < 0):
        k = int(np.argmax(arr < 0)) + 1
        raise RedwoodError(f"{where}: p_{k} = {arr[k - 1]} is negative; acceptance rates must be >= 0")
    total = float(arr.sum())
    if total > 1 + SUM_TOLERANCE:
        raise RedwoodError(f"{where}: sum(p) = {total:.6f} > 1; p must be unconditional "
                           "(if these are conditional rates, convert with conditional_to_unconditional)")
    return arr


def conditional_to_unconditional(c) -> np.ndarray:
    """p_k = c_k * prod_{j<k} (1 - c_j), where c_k = P(rank k accepted | ranks < k rejected)."""
    c = _number_array(c, "conditional rates")
    if np.any((c < 0) | (c > 1)):
        raise RedwoodError("conditional rates must lie in [0, 1]")
    rejected_before = np.concatenate([[1.0], np.cumprod(1.0 - c)[:-1]])
    return c * rejected_before


def unconditional_to_conditional(p) -> np.ndarray:
    """Inverse of `conditional_to_unconditional` (c_k = 0 where nothing is left to accept)."""
    p = validate_p(p)
    left = 1.0 - np.concatenate([[0.0], np.cumsum(p)[:-1]])    # P(ranks < k all rejected)
    return np.where(left > 0, p / np.where(left > 0, left, 1.0), 0.0).clip(0.0, 1.0)


@dataclass
class Acceptance:
    """An unconditional acceptance vector and what it was measured on."""

    p: np.ndarray
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    draft: str = ""
    target: str = ""
    dataset: str = ""
    steps: int | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.p = validate_p(self.p)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "kind": "acceptance", "p": [float(x) for x in self.p],
                "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "draft": self.draft, "target": self.target, "dataset": self.dataset,
                "steps": self.steps, **self.extra}

    @classmethod
    def from_dict(cls, data, where: str = "acceptance") -> "Acceptance":
        _check_header(data, "acceptance", where)
        if "p" not in data:
            raise RedwoodError(f"{where}: missing 'p' (list of unconditional acceptance rates)")
        known = {"p", "temperature", "top_p", "top_k", "draft", "target", "dataset", "steps"}
        extra = {k: v for k, v in data.items() if k not in known | {"format", "kind"}}
        return cls(p=validate_p(data["p"], where), temperature=data.get("temperature"),
                   top_p=data.get("top_p"), top_k=data.get("top_k"),
                   draft=data.get("draft", ""), target=data.get("target", ""),
                   dataset=data.get("dataset", ""), steps=data.get("steps"), extra=extra)

    def save(self, path) -> Path:
        return _write_json(path, self.to_dict())

    @classmethod
    def load(cls, path) -> "Acceptance":
        return cls.from_dict(read_json(path, "acceptance"), where=str(path))


def load_acceptance(path) -> Acceptance:
    return Acceptance.load(path)


def save_acceptance(acceptance: Acceptance, path) -> Path:
    return acceptance.save(path)


# --- acceptance by draft confidence ---------------------------------------------------

# Tenths, with the top tenth split at 0.95 and 0.99: a long chain's value is a product of
# these rates, and a whole [0.9, 1] bin (0.94 at T = 0.6 on the shipped pair) made twenty
# near-certain tokens (q > 0.99) look like 0.94^20 = 0.29 of a chance.
CONFIDENCE_EDGES = tuple(round(x / 10, 12) for x in range(10)) + (0.95, 0.99, 1.0)


@dataclass
class ConfidenceBins:
    """How often the target accepted a drafted token, by the draft's own probability for it
    (the confidence of docs/design.md §4.6): of the drafted tokens the verifier examined with
    edges[b] <= probability < edges[b + 1] (the last bin includes 1), drafted[b] were examined
    and accepted[b] accepted. Stored in an acceptance file as "confidence_bins"."""

    edges: list[float]
    drafted: list[int]
    accepted: list[int]

    def __post_init__(self):
        self.edges = [float(x) for x in self.edges]
        self.drafted = [int(x) for x in self.drafted]
        self.accepted = [int(x) for x in self.accepted]
        bins = len(self.edges) - 1
        if bins < 1 or self.edges[0] != 0.0 or self.edges[-1] != 1.0 \
                or any(b <= a for a, b in zip(self.edges, self.edges[1:])):
            raise RedwoodError("confidence_bins: edges must rise from 0 to 1")
        if len(self.drafted) != bins or len(self.accepted) != bins:
            raise RedwoodError(f"confidence_bins: need {bins} drafted and accepted counts")
        if any(a < 0 or a > d for a, d in zip(self.accepted, self.drafted)):
            raise RedwoodError("confidence_bins: counts must satisfy 0 <= accepted <= drafted")

    @classmethod
    def empty(cls, edges=CONFIDENCE_EDGES) -> "ConfidenceBins":
        return cls(list(edges), [0] * (len(edges) - 1), [0] * (len(edges) - 1))

    def add(self, probability: float, accepted: bool) -> None:
        """Count one examined drafted token of draft probability `probability`."""
        b = int(np.searchsorted(self.edges, probability, side="right")) - 1
        b = min(max(b, 0), len(self.drafted) - 1)
        self.drafted[b] += 1
        self.accepted[b] += int(bool(accepted))

    @property
    def rates(self) -> list[float | None]:
        """accepted / drafted per bin; None where nothing was drafted."""
        return [a / d if d else None for a, d in zip(self.accepted, self.drafted)]

    def to_dict(self) -> dict:
        return {"edges": self.edges, "drafted": self.drafted, "accepted": self.accepted,
                "rate": [None if r is None else round(r, 6) for r in self.rates]}

    @classmethod
    def from_dict(cls, data) -> "ConfidenceBins":
        if not isinstance(data, dict) or not {"edges", "drafted", "accepted"} <= set(data):
            raise RedwoodError("confidence_bins must be an object with edges, drafted, accepted")
        return cls(data["edges"], data["drafted"], data["accepted"])

    @classmethod
    def of(cls, acceptance: "Acceptance") -> "ConfidenceBins | None":
        """The bins an acceptance file recorded (None for files written before they were)."""
        data = acceptance.extra.get("confidence_bins")
        return None if data is None else cls.from_dict(data)


# --- latency profiles ------------------------------------------------------------------

@dataclass
class Profile:
    """Measured forward times in milliseconds: target by tree size, draft by level width.

    target_ms is measured on top of `context` cached tokens (128 in the first-use profile).
    target_ms_by_context, when measured (the llama.cpp first-use profile), holds the target's
    times at several context lengths, {cells: {n: ms}}: every forward attends over all cached
    cells, so on a CPU t(n) grows with the context (about linearly in cells), and a request at
    2,000 tokens pays more per tree node than the 128-token table says. target_ms_at(context)
    reads it; None = only target_ms was measured (older files)."""

    target_ms: dict[int, float]
    draft_ms: dict[int, float]
    device: str = ""
    dtype: str = ""
    context: int | None = None
    extra: dict = field(default_factory=dict)
    target_ms_by_context: dict[int, dict[int, float]] | None = None

    def __post_init__(self):
        self.target_ms = _check_times(self.target_ms, "target_ms", "profile")
        self.draft_ms = _check_times(self.draft_ms, "draft_ms", "profile")
        if self.target_ms_by_context is not None:
            self.target_ms_by_context = check_times_by_context(self.target_ms_by_context)

    def target_ms_at(self, context: int) -> dict[int, float]:
        """{n: ms} at `context` cached cells: linear in context between the two nearest
        measured contexts (attention cost grows about linearly with cells), constant beyond
        the smallest and largest, for the sizes measured at every context; target_ms when
        there is no by-context table."""
        if not self.target_ms_by_context:
            return dict(self.target_ms)
        return interpolate_by_context(self.target_ms_by_context, context)

    def draft_level_ms(self, width: int) -> float | None:
        """Draft time for a level of `width` tokens: the time measured at the nearest width
        at or above `width` (never an interpolation); None if `width` exceeds every measured
        width."""
        above = [w for w in self.draft_ms if w >= width]
        return self.draft_ms[min(above)] if above else None

    def to_dict(self) -> dict:
        return {"format": FORMAT, "kind": "profile", "device": self.device, "dtype": self.dtype,
                "context": self.context,
                "target_ms": {str(n): t for n, t in sorted(self.target_ms.items())},
                "draft_ms": {str(n): t for n, t in sorted(self.draft_ms.items())},
                **({} if self.target_ms_by_context is None else {"target_ms_by_context": {
                    str(c): {str(n): t for n, t in sorted(times.items())}
                    for c, times in sorted(self.target_ms_by_context.items())}}),
                **self.extra}

    @classmethod
    def from_dict(cls, data, where: str = "profile") -> "Profile":
        _check_header(data, "profile", where)
        for key in ("target_ms", "draft_ms"):
            if key not in data:
                raise RedwoodError(f"{where}: missing '{key}' (object mapping size to milliseconds)")
        known = {"format", "kind", "device", "dtype", "context", "target_ms", "draft_ms",
                 "target_ms_by_context"}
        by_context = data.get("target_ms_by_context")
        return cls(target_ms=_check_times(data["target_ms"], "target_ms", where),
                   draft_ms=_check_times(data["draft_ms"], "draft_ms", where),
                   device=data.get("device", ""), dtype=data.get("dtype", ""),
                   context=data.get("context"),
                   extra={k: v for k, v in data.items() if k not in known},
                   target_ms_by_context=None if by_context is None
                   else check_times_by_context(by_context, where))

    def save(self, path) -> Path:
        return _write_json(path, self.to_dict())

    @classmethod
    def load(cls, path) -> "Profile":
        return cls.from_dict(read_json(path, "profile"), where=str(path))


def check_times_by_context(table, where: str = "profile") -> dict[int, dict[int, float]]:
    """Validate {context: {size: ms}}: contexts positive integers (JSON strings allowed), each
    table checked as target_ms is; sorted by context."""
    key = "target_ms_by_context"
    if not isinstance(table, dict) or not table:
        raise RedwoodError(f"{where}: '{key}' must be a non-empty object like "
                           '{"128": {"1": 312.0}}')
    out: dict[int, dict[int, float]] = {}
    for raw_c, times in table.items():
        c = _positive_int_key(raw_c)
        if c is None:
            raise RedwoodError(f"{where}: {key} key {raw_c!r} is not a positive context length")
        out[c] = _check_times(times, f"{key}[{c}]", where)
    return dict(sorted(out.items()))


def interpolate_by_context(table: dict[int, dict[int, float]], context: int) -> dict[int, float]:
    """{n: ms} at `context` from a validated {context: {n: ms}} table: linear between the two
    nearest measured contexts, the end tables beyond them; only sizes measured at every
    context (a size missing at one would otherwise be extrapolated from the others)."""
    contexts = sorted(table)
    sizes = sorted(set.intersection(*(set(table[c]) for c in contexts)))
    if context <= contexts[0] or len(contexts) == 1:
        return {n: table[contexts[0]][n] for n in sizes}
    if context >= contexts[-1]:
        return {n: table[contexts[-1]][n] for n in sizes}
    hi = next(i for i, c in enumerate(contexts) if c >= context)
    lo_c, hi_c = contexts[hi - 1], contexts[hi]
    w = (context - lo_c) / (hi_c - lo_c)
    return {n: (1.0 - w) * table[lo_c][n] + w * table[hi_c][n] for n in sizes}


def load_profile(path) -> Profile:
    return Profile.load(path)


def save_profile(profile: Profile, path) -> Path:
    return profile.save(path)


# --- shipped samples -------------------------------------------------------------------

def sample_acceptance_path() -> Path:
    """The shipped sample acceptance vector (illustrative, not a measurement you should trust)."""
    return Path(str(resources.files("redwood") / "data" / "sample_acceptance.json"))


def sample_profile_path() -> Path:
    """The shipped sample latency profile (illustrative figures for a 2-core CPU)."""
    return Path(str(resources.files("redwood") / "data" / "sample_profile.json"))


# --- helpers ---------------------------------------------------------------------------

def _number_array(values, what: str) -> np.ndarray:
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise RedwoodError(f"{what} must be a list of numbers")
    if len(values) == 0:
        raise RedwoodError(f"{what} is empty; give at least p_1")
    for i, x in enumerate(values):
        if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
            raise RedwoodError(f"{what}[{i}] is {x!r}; expected a number")
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise RedwoodError(f"{what} must be a flat list of numbers")
    if not np.all(np.isfinite(arr)):
        raise RedwoodError(f"{what} contains a non-finite value")
    return arr


def _positive_int_key(raw) -> int | None:
    """A JSON object key (or int) as a positive integer, None if it is not one: "12" -> 12,
    "012", "1.5", "x", "0" -> None."""
    try:
        n = int(raw)
    except (TypeError, ValueError):
        return None
    return n if n >= 1 and str(n) == str(raw).strip() else None


def _check_times(times, key: str, where: str) -> dict[int, float]:
    """Validate {size: ms}: keys positive integers (JSON strings allowed), values positive, 1 present."""
    if not isinstance(times, dict) or not times:
        raise RedwoodError(f"{where}: '{key}' must be a non-empty object like {{\"1\": 312.0}}")
    out: dict[int, float] = {}
    for raw_n, raw_t in times.items():
        n = _positive_int_key(raw_n)
        if n is None:
            raise RedwoodError(f"{where}: {key} key {raw_n!r} is not a positive integer size")
        if isinstance(raw_t, bool) or not isinstance(raw_t, (int, float)) \
                or not math.isfinite(raw_t) or raw_t <= 0:
            raise RedwoodError(f"{where}: {key}[{n}] = {raw_t!r}; times must be positive milliseconds")
        out[n] = float(raw_t)
    if 1 not in out:
        raise RedwoodError(f"{where}: {key} has no entry for size 1; measure n = 1 "
                           "(plain decoding is the baseline)")
    return dict(sorted(out.items()))


def _check_header(data, kind: str, where: str) -> None:
    if not isinstance(data, dict):
        raise RedwoodError(f"{where}: expected a JSON object ({kind} file)")
    if data.get("kind", kind) != kind:
        raise RedwoodError(f"{where}: kind is {data.get('kind')!r}, expected {kind!r}")
    if data.get("format", FORMAT) != FORMAT:
        raise RedwoodError(f"{where}: format {data.get('format')!r} is not supported "
                           f"(this redwood reads format {FORMAT})")


def _write_json(path, data) -> Path:
    path = Path(path)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
