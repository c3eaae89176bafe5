"""One request's step costs as this machine charges them now: the profile corrected online.

The machine profile measures t_target(n) once, at first use, at a short context, on whatever the
machine was doing then. A request runs at its own context length (a 1,000-token conversation
makes every forward slower than at 128) and on a machine whose neighbours come and go, and the
error is not the same for every size: on one 2-core EPYC t(8) read 2.6x t(4) while the profile
said 1.3x. A drafter that sizes trees from the profile alone then drafts where drafting loses
(an n-gram drafter measured 0.71x plain llama.cpp on an edit its cost model said would pay).

`LiveCosts` learns, from the forwards the request actually timed, the ratio observed / predicted
per *measured size* (the profile size a prediction used: the nearest measured size at or above
n), and for the draft's forwards. `target_ms(n)` is then the profile's t(n) times that ratio, so
the n-gram drafter's E(n) / t(n) and the governor's speculate-or-not decision use what steps cost
on this request.

- Each ratio is a decayed geometric mean in log space (weight `decay` on the past per sample of
  its key), clipped to [low, high] per sample: step times have heavy right tails (another
  process's burst), and one outlier moves a geometric mean by at most high ** (1 - decay).
- Shrinkage: a size with few samples of its own borrows from the pooled ratio of the other
  speculative sizes (n > 1), weighted as `prior_weight` samples, so a size never tried is
  assumed as mispredicted as the sizes that were; before any speculative size was timed, as
  mispredicted as the plain steps. That matters: a profile that reads every size 15 % high
  (a common error) would otherwise, once plain steps are timed at 0.85, make every tree look
  15 % dearer than plain decoding than it is, and a self-sizing drafter (no governor, no probes)
  would never draft a tree to learn otherwise. Size 1 (a plain step) never borrows: its prior
  is the profile itself (ratio 1), weighted as `plain_prior_weight` samples (less: one plain
  step, which the governor times early, should count for most of what is known).
- Which forwards are recorded is the engine's choice: plain steps of one token and verify
  forwards of a tree, never forwards that also ran prompt tokens (a fused first step).

Costs read from the clock make speculate-or-not depend on timing, so a seeded sampled request
is exact in distribution but not reproducible token for token across runs (greedy output is
the target's greedy output either way); `Engine(live_costs=False)` keeps the profile's costs.
Pure python, like the rest of redwood.plan.
"""
from __future__ import annotations

import math
from bisect import bisect_left

DRAFT = "draft"
CONTEXT_BUCKET = 64        # follow() re-reads the profile when the context enters a new bucket


def measured_size(sizes: list[int], n: int) -> int:
    """The measured size whose time predicts a forward over n tokens: the nearest at or above
    n, the largest beyond them (sizes sorted ascending)."""
    at = bisect_left(sizes, n)
    return sizes[at] if at < len(sizes) else sizes[-1]


def measured_ms(times: dict[int, float], n: int, sizes: list[int] | None = None) -> float:
    """times {size: ms} at size n: the nearest measured size at or above n, scaled linearly
    beyond the largest (never interpolated between measured sizes). sizes: sorted(times), where
    the caller keeps it (a plain step's record reads one size; sorting 20+ each time was most of
    its cost)."""
    key = measured_size(sorted(times) if sizes is None else sizes, n)
    return times[key] * (n / key if n > key else 1.0)


class LiveCosts:
    """observed / predicted forward times on one request (module doc). target_ms: the
    profile's {n: ms} (n = tree nodes, root included; must include 1)."""

    def __init__(self, target_ms: dict[int, float], decay: float = 0.8,
                 prior_weight: float = 2.0, plain_prior_weight: float = 0.5,
                 low: float = 0.33, high: float = 4.0, table_at=None, context: int = 0):
        if not (0.0 <= decay < 1.0 and prior_weight > 0.0 and plain_prior_weight > 0.0
                and 0.0 < low <= 1.0 <= high):
            raise ValueError("LiveCosts: need 0 <= decay < 1, prior_weight > 0, "
                             "0 < low <= 1 <= high")
        times = {int(n): float(ms) for n, ms in dict(target_ms).items()}
        if 1 not in times or any(n < 1 or not ms > 0 for n, ms in times.items()):
            raise ValueError("LiveCosts: target_ms needs positive times by size n >= 1, "
                             "including n = 1")
        self.profile_ms = times
        self.sizes = sorted(times)
        self.decay, self.prior_weight = float(decay), float(prior_weight)
        self.plain_prior_weight = float(plain_prior_weight)
        self._low, self._high = math.log(low), math.log(high)
        self._sum: dict = {}           # key -> decayed sum of log ratios
        self._weight: dict = {}        # key -> decayed sample count
        self.samples: dict = {}        # key -> samples recorded (undecayed, for reports)
        self._table: dict[int, float] | None = None     # table(), until the next record
        # table_at(context) -> {n: ms}: the profile at a context (Profile.target_ms_at), so
        # follow() keeps the predictions at the request's context as it grows
        self._table_at, self._bucket = table_at, int(context) // CONTEXT_BUCKET

    @classmethod
    def for_request(cls, profile, context: int) -> "LiveCosts":
        """A request's costs from a plan.formats.Profile at `context` cells: the profile's
        table there, re-read as the context grows where it has a by-context table."""
        by_context = profile.target_ms_at if profile.target_ms_by_context else None
        return cls(profile.target_ms_at(context), table_at=by_context, context=context)

    def follow(self, context: int) -> None:
        """The request's context is now `context` cells: rebase on the profile there when it
        entered another CONTEXT_BUCKET (a dict lookup otherwise; nothing without table_at)."""
        bucket = int(context) // CONTEXT_BUCKET
        if self._table_at is not None and bucket != self._bucket:
            self._bucket = bucket
            self.rebase(self._table_at(bucket * CONTEXT_BUCKET))

    def rebase(self, target_ms: dict[int, float]) -> None:
        """Predict from another table of the same sizes from now on (the profile at the
        request's current context, as it grows): the learnt ratios then correct what the
        context does not explain, and the context is not counted twice."""
        times = {int(n): float(ms) for n, ms in dict(target_ms).items()}
        if sorted(times) != self.sizes or any(not ms > 0 for ms in times.values()):
            raise ValueError("LiveCosts.rebase: need positive times for the same sizes")
        self.profile_ms, self._table = times, None

    # -- what the profile says, and the corrected figure ------------------------------------
    def size_key(self, n: int) -> int:
        """The measured size whose time predicts a forward over n tokens."""
        return measured_size(self.sizes, n)

    def predicted_ms(self, n: int) -> float:
        """The profile's t(n) (measured_ms)."""
        return measured_ms(self.profile_ms, n, self.sizes)

    def target_ms(self, n: int) -> float:
        """t(n) as this request's forwards have cost: the profile's times the learnt ratio."""
        return self.predicted_ms(n) * self.ratio(self.size_key(n))

    def table(self) -> dict[int, float]:
        """{n: target_ms(n)} over the measured sizes, as a drafter sizing a tree reads it every
        step: kept until the next record or rebase (a plain step costs ~35 ms on a 2-core CPU,
        and reading 20+ sizes afresh twice a step cost ~0.15 ms of it)."""
        if self._table is None:
            pooled = self._pooled()
            untimed = math.exp(pooled)          # the ratio of a size with no samples of its own
            weights = self._weight
            self._table = {n: self.profile_ms[n] * (
                self._ratio(n, pooled) if n == 1 or n in weights else untimed)
                for n in self.sizes}
        return self._table

    def ratio(self, key) -> float:
        """The learnt observed / predicted ratio of a measured size (or DRAFT)."""
        return self._ratio(key, None)

    def _ratio(self, key, pooled: float | None) -> float:
        own_sum, own_weight = self._sum.get(key, 0.0), self._weight.get(key, 0.0)
        if key == 1 or key == DRAFT:                     # the profile (log ratio 0), until timed
            return math.exp(own_sum / (own_weight + self.plain_prior_weight))
        weight = self.prior_weight
        pooled = self._pooled() if pooled is None else pooled
        return math.exp((own_sum + weight * pooled) / (own_weight + weight))

    # -- learning -----------------------------------------------------------------------------
    def record_target(self, n: int, observed_s: float) -> bool:
        """A target forward over n tokens took observed_s seconds. Returns whether recorded."""
        if n < 1:
            return False
        return self._record(self.size_key(n), self.predicted_ms(n), observed_s)

    def record_draft(self, predicted_ms: float, observed_s: float) -> bool:
        """The draft's forwards of one step, predicted and observed."""
        return self._record(DRAFT, predicted_ms, observed_s)

    def _record(self, key, predicted_ms: float, observed_s: float) -> bool:
        if not predicted_ms > 0 or not observed_s > 0:
            return False
        sample = min(self._high, max(self._low, math.log(1000.0 * observed_s / predicted_ms)))
        self._sum[key] = self.decay * self._sum.get(key, 0.0) + sample
        self._weight[key] = self.decay * self._weight.get(key, 0.0) + 1.0
        self.samples[key] = self.samples.get(key, 0) + 1
        self._table = None
        return True

    def _pooled(self) -> float:
        """The weighted mean log ratio of the speculative sizes (n > 1) timed so far; before
        any, that of the plain steps (the error they show is the machine's and the context's,
        common to every size), else 0 (the profile)."""
        keys = [k for k in self._weight if k not in (1, DRAFT)] or \
            [k for k in self._weight if k == 1]
        weight = sum(self._weight[k] for k in keys)
        return sum(self._sum[k] for k in keys) / weight if weight > 0 else 0.0

    def as_dict(self) -> dict:
        """{"ratios": {"1": r, "4": r, ..., "draft": r}, "samples": {...}} for the sizes timed."""
        keys = sorted((k for k in self.samples if k != DRAFT)) + \
            ([DRAFT] if DRAFT in self.samples else [])
        return {"ratios": {str(k): round(self.ratio(k), 4) for k in keys},
                "samples": {str(k): self.samples[k] for k in keys}}
