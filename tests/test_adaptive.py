"""Adaptive trees: the threshold and maximum tree `plan_adaptive` derives from a profile."""
import subprocess
import sys

import numpy as np
import pytest

from redwood.plan.adaptive import MAX_THRESHOLD, MIN_THRESHOLD, plan_adaptive
from redwood.plan.formats import Profile
from redwood.plan.planner import choose_tree, optimal_tree
from redwood.plan.tree import chain

P = np.array([0.8, 0.1, 0.05, 0.02])


def _profile(target, draft):
    return Profile({n: t for n, t in enumerate(target, start=1)},
                   {w: t for w, t in enumerate(draft, start=1)})


def test_threshold_is_marginal_cost_over_time_per_token():
    # Target cost grows 20 ms per row; a draft level costs 40 ms.
    profile = _profile([300 + 20 * i for i in range(8)], [40] * 8)
    static = choose_tree(P, profile, 8, 6)
    plan = plan_adaptive(P, profile, static, 8, 6)
    assert plan.marginal_ms == pytest.approx(40 + 20)
    assert plan.ms_per_token == pytest.approx(static.step_ms / static.tokens_per_step)
    assert plan.draft_confidence == pytest.approx(60 / plan.ms_per_token)
    assert plan.tree.source["draft_confidence"] == plan.draft_confidence


def test_a_chain_machine_gets_a_deep_chain_and_a_flat_one_the_dp_tree():
    steep = _profile([300 + 60 * i for i in range(8)], [30] * 8)      # width costs: chains
    static = choose_tree(P, steep, 8, 6)
    assert static.tree.max_width == 1
    assert plan_adaptive(P, steep, static, 8, 6).tree == chain(6)
    flat = _profile([300] * 8, [30] * 8)                               # width is free: a tree
    static = choose_tree(P, flat, 8, 6)
    assert static.tree.max_width > 1
    assert plan_adaptive(P, flat, static, 8, 6).tree == optimal_tree(P, 8, 6)


def test_threshold_is_clipped_to_a_useful_range():
    cheap = _profile([300] * 8, [0.001] * 8)
    assert plan_adaptive(P, cheap, choose_tree(P, cheap, 8, 6), 8, 6).draft_confidence == MIN_THRESHOLD
    dear = _profile([300 + 500 * i for i in range(8)], [5000] * 8)
    assert plan_adaptive(P, dear, choose_tree(P, dear, 8, 6), 8, 6).draft_confidence == MAX_THRESHOLD


def test_adaptive_planning_does_not_import_torch():
    code = "import sys, redwood.plan.adaptive; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_given_threshold_replaces_the_estimate():
    profile = _profile([300 + 20 * i for i in range(8)], [40] * 8)
    static = choose_tree(P, profile, 8, 6)
    estimated = plan_adaptive(P, profile, static, 8, 6)
    given = plan_adaptive(P, profile, static, 8, 6, draft_confidence=0.6)
    assert given.draft_confidence == 0.6
    assert given.estimated_confidence == estimated.estimated_confidence == estimated.draft_confidence
    assert given.tree == estimated.tree
    assert (estimated.threshold_from, given.threshold_from) == ("estimate", "given")


def test_no_speculation_when_the_planner_declines():
    """A costly draft on a steep t(n): the static choice is budget 1 and the adaptive plan
    must not speculate either; the tree says what it was chosen over."""
    from redwood.plan.adaptive import plan_adaptive
    from redwood.plan.formats import Profile
    from redwood.plan.planner import choose_tree

    profile = Profile(target_ms={1: 33.0, 2: 49.0, 4: 82.0, 8: 132.0},
                      draft_ms={1: 17.0, 2: 40.0, 4: 55.0, 8: 73.0})
    p = [0.6, 0.1, 0.05]
    static = choose_tree(p, profile, 8, 6)
    assert static.budget == 1 and len(static.tree) == 1
    rejected = static.tree.source["best_rejected"]
    assert rejected["budget"] > 1 and rejected["predicted_speedup"] < 1.0
    plan = plan_adaptive(p, profile, static, 8, 6)
    assert len(plan.tree) == 1
