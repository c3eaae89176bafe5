"""Live correction of the batch planner's step-time predictions.

The batch planner predicts a step's time from a profile of t_target(N) and t_draft(width)
measured once, at first use. The step the scheduler then runs costs more than that: Python work
the profile does not see (drafting bookkeeping, logits copies, verification, the clients'
callbacks), and a profile measured while the machine was busy is off by whatever the neighbours
did. Speculative steps carry most of that unmodelled work, so a profile can make speculation
look worth it when it is not (a load test measured batched + speculative 3-11 % below batched
plain decoding at every concurrency).

`StepCosts` learns, from the steps the scheduler actually timed, the ratio observed / predicted
separately for steps whose plan speculated and steps whose plan was plain. The planner rates a
candidate allocation with its predicted ms times the ratio of its kind, so a profile that
underestimates speculative steps stops choosing them within a few steps; only the ratio of the
two ratios changes the choice, so unmodelled work common to both kinds cancels out.

- Each ratio is an exponentially decayed geometric mean (weight `decay` on the past per step),
  starting at 1.0 (trust the profile). In log space because step times have heavy right tails
  (another process's burst made a 28 ms decode read 56-3200 ms): one outlier moves the
  geometric mean by a factor of at most high ** (1 - decay), the arithmetic one by far more.
  Every observed ratio is clipped to [low, high], so the means stay there too.
- A kind the planner stops choosing is no longer observed and keeps its ratio: once
  speculation is found to cost more than predicted, relative to plain steps, it stays off
  until plain steps turn out as mispredicted (only the ratio of the two ratios matters). A
  drift back toward the other kind's ratio would retry it now and then, but every retry runs
  steps at the losing kind: in simulation (speculation predicted 2x plain's rate, costing 4x its
  prediction) drifting by 0.1 % per step lost 3 % of the throughput, drifting by 0.05 % per
  step 1.5 %. The requirement is never to be slower than plain decoding, so there is no drift.
- `quantised()` rounds the log ratios to `quantum` (0.05: steps of about 5 %): the planner
  caches plans per batch composition and quantised ratios, so plans follow the correction
  without replanning every step.

Which steps are recorded is the scheduler's choice (serve/batching.py): only steps whose time is
what the plan predicted, i.e. without prompt chunks and without draft catch-up chunks.
Pure python, like the rest of redwood.plan.
"""
from __future__ import annotations

import math

KINDS = ("speculative", "plain")


class StepCosts:
    """observed / predicted step time for speculative and for plain steps (module doc).
    decay 1: the ratios stay 1 (the profile is trusted as it is; tests of its own choices)."""

    def __init__(self, decay: float = 0.9, low: float = 0.5, high: float = 4.0,
                 quantum: float = 0.05):
        if not (0.0 <= decay <= 1.0 and 0.0 < low <= 1.0 <= high and quantum > 0.0):
            raise ValueError("StepCosts: need 0 <= decay <= 1, 0 < low <= 1 <= high, quantum > 0")
        self.decay, self.quantum = decay, quantum
        self._low, self._high = math.log(low), math.log(high)
        self._log = {kind: 0.0 for kind in KINDS}
        self.steps = {kind: 0 for kind in KINDS}      # recorded steps per kind
        self._quantised: tuple | None = None          # quantised(), until the next record

    @property
    def ratios(self) -> dict:
        """{"speculative": r, "plain": r}: the learnt observed / predicted ratios."""
        return {kind: math.exp(value) for kind, value in self._log.items()}

    def quantised(self) -> tuple[float, float]:
        """(speculative, plain) ratios rounded to `quantum` in log space (part of the plan
        cache's key); kept until the next recorded step (the planner asks every step)."""
        if self._quantised is None:
            self._quantised = tuple(math.exp(round(self._log[kind] / self.quantum) * self.quantum)
                                    for kind in KINDS)
        return self._quantised

    def record(self, speculative: bool, predicted_ms: float | None, observed_s: float) -> bool:
        """One timed step: its plan's predicted ms and its observed seconds. Returns whether it
        was recorded (a step without a prediction, or a non-positive time, is not)."""
        if predicted_ms is None or not predicted_ms > 0 or not observed_s > 0:
            return False
        kind = KINDS[0] if speculative else KINDS[1]
        sample = min(self._high, max(self._low, math.log(1000.0 * observed_s / predicted_ms)))
        self._log[kind] = self.decay * self._log[kind] + (1.0 - self.decay) * sample
        self._quantised = None
        self.steps[kind] += 1
        return True
