"""Adaptive trees: a deeper tree that drafting prunes by the draft's confidence.

A static tree is sized for the *average* acceptance; real acceptance swings with the
text (boilerplate is near-certain, a new identifier is not). With a pruning threshold c,
a node gets draft children only while the draft gave every token on its path a
probability >= c (Engine's `draft_confidence`), so predictable stretches grow long paths
and hard spots stop early. The choice here is pure numpy, from the same profile and vector
as the static choice:

- threshold: drafting one more token costs about one draft level plus one more target row
  (`marginal_ms`); it pays when that token is kept with probability above
  marginal_ms / ms_per_token, the time a token costs at the static optimum. The draft's
  probability of a token stands in for that chance. This is a first estimate: on the
  shipped pair the draft is under-confident (the target agrees more often than the
  draft's probabilities say) and a measured sweep on calibration prompts found a higher
  threshold faster (benchmarks/draft_confidence_sweep.py); `redwood tune
  --draft-confidence C` records a measured value instead.
- maximum tree: when the static optimum is a chain (width does not pay on this machine),
  a chain of the maximum depth; otherwise the DP tree of the largest measured budget.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from redwood.plan.formats import Profile
from redwood.plan.planner import TreeChoice, optimal_tree
from redwood.plan.tree import Tree, chain

MIN_THRESHOLD, MAX_THRESHOLD = 0.05, 0.95


@dataclass
class AdaptivePlan:
    tree: Tree                  # the largest tree drafting may grow to
    draft_confidence: float     # the pruning threshold
    marginal_ms: float          # one draft level of width 1 plus the target's cost per extra row
    ms_per_token: float         # step time per token of the static choice
    estimated_confidence: float  # marginal_ms / ms_per_token, clipped (used unless one was given)
    threshold_from: str = "estimate"   # "estimate", or "given" (a measured value passed in)


def is_chain(tree: Tree) -> bool:
    return tree.max_width <= 1


def plan_adaptive(p, profile: Profile, static: TreeChoice, max_budget: int, max_depth: int,
                  draft_confidence: float | None = None) -> AdaptivePlan:
    """The adaptive tree and threshold to go with a static `choose_tree` result; a given
    `draft_confidence` (e.g. measured) replaces the estimated threshold."""
    budgets = sorted(n for n in profile.target_ms if n <= max_budget)
    largest = budgets[-1]
    per_row = 0.0
    if largest > 1:              # mean slope of t(n): robust to the jumps between sizes
        per_row = (profile.target_ms[largest] - profile.target_ms[1]) / (largest - 1)
    draft_level = profile.draft_level_ms(1) or 0.0
    marginal = draft_level + max(per_row, 0.0)
    ms_per_token = static.step_ms / static.tokens_per_step
    estimate = float(np.clip(marginal / ms_per_token, MIN_THRESHOLD, MAX_THRESHOLD))
    threshold = estimate if draft_confidence is None else float(draft_confidence)
    if len(static.tree) == 1:    # the planner declines to speculate: so must adaptive drafting
        tree = Tree([-1], {"kind": "no speculation"})
    elif is_chain(static.tree):
        tree = chain(max(max_depth, static.tree.num_levels))
    else:
        tree = optimal_tree(p, largest, max_depth)
    tree.source.update({"chosen_by": "plan_adaptive", "draft_confidence": threshold})
    return AdaptivePlan(tree, threshold, marginal, ms_per_token, estimate,
                        "estimate" if draft_confidence is None else "given")
