"""Per request: speculate only while it pays (docs/design.md §3).

The planner sizes a tree from an acceptance vector averaged over a data set; a single prompt can
be far easier or harder. The governor compares, step by step, what speculation yields on *this*
request (tokens kept per speculative step, decayed so recent steps weigh most) per millisecond of
predicted step cost (the machine profile's t_target(n) plus the draft's level costs for the tree
actually drafted) against plain decoding's 1 token per t_target(1). When speculation loses it
switches to plain target steps and probes again now and then.

Only past outcomes and measured costs decide, never the current step's draws, so every verifier
stays exact. The costs are the profile's corrected by what this request's forwards took
(`costs`, a plan.live_costs.LiveCosts the engine feeds): a machine whose profile flatters
drafting (a longer context, a busy neighbour, a tree size the profile misread) turns plain
within a few steps. Without `costs` they are the profile's alone (a seeded request then gives
the same tokens on every run).
"""
from __future__ import annotations

from dataclasses import dataclass

from redwood.plan.live_costs import DRAFT, measured_ms  # noqa: F401  (measured_ms: re-exported)


@dataclass
class Governor:
    plain_ms: float                 # t_target(1): the cost of one plain token
    prior_tokens_per_ms: float      # the plan's prediction, worth `prior_steps` observed steps
    prior_steps: float = 2.0
    decay: float = 0.8              # per speculative step: ~5 recent steps dominate
    probe_every: int = 8            # plain steps between probes while speculation is off
    tokens: float = 0.0             # decayed tokens kept by speculative steps
    ms: float = 0.0                 # decayed predicted ms of those steps
    plain_run: int = 0
    speculative_steps: int = 0
    plain_steps: int = 0
    costs: object = None            # plan.live_costs.LiveCosts, or None: the profile's costs
    # with live costs: after the first speculative step, and then after this many speculative
    # steps in a row, one plain step re-times t(1), so speculation is judged against what a
    # plain step costs on this request, not against the profile's t(1)
    retime_every: int = 32
    since_plain: int = 0

    def __post_init__(self):
        self.tokens = self.prior_tokens_per_ms * self.prior_steps * self.plain_ms
        self.ms = self.prior_steps * self.plain_ms

    @property
    def tokens_per_ms(self) -> float:
        return self.tokens / self.ms if self.ms > 0 else 0.0

    @property
    def plain_cost_ms(self) -> float:
        """What a plain step costs now: the profile's t(1), corrected when costs are live."""
        return self.costs.target_ms(1) if self.costs is not None else self.plain_ms

    def speculate(self) -> bool:
        """Whether the next step should draft (else: one plain target step)."""
        if self._retime_plain():
            self.since_plain, self.plain_run = 0, 0
            self.plain_steps += 1
            return False
        if self.tokens_per_ms * self.plain_cost_ms >= 1.0 - 1e-9:    # ties (the neutral prior): try
            self.plain_run = 0
            return True
        self.plain_run += 1
        if self.plain_run > self.probe_every:        # conditions change within a text: look again
            self.plain_run = 0
            return True
        self.plain_steps += 1
        self.since_plain = 0
        return False

    def _retime_plain(self) -> bool:
        """Live costs only: time a plain step when none was timed yet (after the first
        speculative step) or none for `retime_every` speculative steps."""
        if self.costs is None or self.speculative_steps < 1:
            return False
        untimed = self.plain_steps == 0 and self.costs.samples.get(1, 0) == 0
        return untimed or self.since_plain >= self.retime_every

    def record(self, tokens: int, predicted_ms: float) -> None:
        """A speculative step kept `tokens` (bonus included) at a cost of `predicted_ms` (the
        profile's prediction, corrected by `costs` when live: see step_ms)."""
        self.tokens = self.decay * self.tokens + tokens
        self.ms = self.decay * self.ms + predicted_ms
        self.speculative_steps += 1
        self.since_plain += 1

    def as_dict(self) -> dict:
        out = {"speculative_steps": self.speculative_steps, "plain_steps": self.plain_steps,
               "live_tokens_per_ms": self.tokens_per_ms,
               "plain_tokens_per_ms": 1.0 / self.plain_cost_ms}
        if self.costs is not None:
            out["step_cost_ratios"] = self.costs.as_dict()["ratios"]
        return out


def step_ms(profile, tree, draft_levels: int, costs=None) -> float:
    """Predicted ms of a step from a machine profile: the target's forward over the tree's
    nodes (root included; the nearest measured size at or above, scaled beyond the largest)
    plus the draft's forwards over the first `draft_levels` levels (0 for a free drafter).
    costs (plan.live_costs.LiveCosts): both parts corrected by what this request measured."""
    if costs is None:
        return target_ms(profile, len(tree)) + draft_ms(profile, tree, draft_levels)
    return costs.target_ms(len(tree)) + draft_ms(profile, tree, draft_levels) * costs.ratio(DRAFT)


def target_ms(profile, n: int) -> float:
    """The target's forward over n tokens (see measured_ms)."""
    return measured_ms(profile.target_ms, n)


def draft_level_ms(profile, width: int) -> float:
    """One draft forward over `width` nodes: the profile's level cost, scaled linearly beyond
    the widest measured width."""
    level = profile.draft_level_ms(width)
    if level is not None:
        return level
    widest = max(profile.draft_ms)
    return profile.draft_ms[widest] * width / widest


def draft_ms(profile, tree, draft_levels: int) -> float:
    """The draft's forwards over the first `draft_levels` levels of `tree`."""
    return sum(draft_level_ms(profile, width) for width in tree.level_sizes[:draft_levels])
