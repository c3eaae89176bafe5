"""The Sequoia DP (against brute force and a loop oracle) and the hardware-aware choice."""
import math
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import redwood
from redwood.errors import RedwoodError
from redwood.plan.formats import Profile
from redwood.plan.planner import (chain, choose_tree, dp_table, optimal_tree, reference_values,
                             specinfer, star, step_draft_ms)
from redwood.plan.tree import Tree

# --- brute force: every ordered tree with n nodes, <= l levels, <= w children per node ------


@lru_cache(maxsize=None)
def all_trees(n, levels, width):
    """Ordered trees as nested tuples (a tree = tuple of its child subtrees, rank order)."""
    if n == 1:
        return ((),)
    if levels == 1:
        return ()
    return tuple(_forests(n - 1, levels - 1, width, width))


def _forests(total, levels, slots, width):
    """Sequences of at most `slots` trees with `total` nodes in all."""
    if total == 0:
        yield ()
        return
    if slots == 0:
        return
    for first in range(1, total + 1):
        for head in all_trees(first, levels, width):
            for rest in _forests(total - first, levels, slots - 1, width):
                yield (head,) + rest


def nested_value(t, p):
    return 1.0 + sum((p[k] if k < len(p) else 0.0) * nested_value(c, p) for k, c in enumerate(t))


def nested_to_parents(t):
    parents, queue = [-1], [(0, t)]
    for node, sub in queue:
        for child in sub:
            queue.append((len(parents), child))
            parents.append(node)
    return parents


def test_enumeration_counts_are_catalan():
    for n in range(1, 9):
        assert len(all_trees(n, n, n)) == math.comb(2 * (n - 1), n - 1) // n


def test_enumeration_respects_limits():
    for t in all_trees(7, 3, 2):
        tree = Tree(nested_to_parents(t))
        assert tree.num_levels <= 3 and tree.max_width <= 2 and len(tree) == 7


p_vectors = st.integers(1, 4).flatmap(lambda w: st.tuples(
    st.lists(st.sampled_from([0.0, 0.05, 0.1, 0.3, 0.5, 0.8]) | st.floats(1e-9, 1), min_size=w,
             max_size=w),
    st.floats(0.05, 1.0)))


def _normalise(raw):
    values, mass = raw
    values = np.array(values)
    return values * (mass / values.sum()) if values.sum() > 0 else values


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p_vectors, st.booleans())
def test_dp_equals_brute_force(raw, descending):
    p = _normalise(raw)
    if descending:                         # sorted p takes the size-bound path of the DP
        p = np.sort(p)[::-1]
    W, N, D = len(p), 8, 5
    tables = [dp_table(p, N, D), dp_table(p, N, D, size_bound=False)]
    for d in range(1, D + 1):
        for n in range(1, N + 1):
            trees = all_trees(n, d, W)
            if not trees:
                assert all(t.values[n, d] == -np.inf for t in tables)
                continue
            best = max(nested_value(t, p) for t in trees)
            for table in tables:
                assert table.values[n, d] == pytest.approx(best, rel=1e-12, abs=1e-12)
                tree = table.tree(n, d)
                assert len(tree) == n and tree.num_levels <= d and tree.max_width <= W
                assert tree.expected_length(p) == pytest.approx(best, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("seed,N,D,W", [(0, 40, 7, 6), (1, 30, 30, 3), (2, 25, 4, 12)])
def test_vectorised_dp_equals_loop_oracle(seed, N, D, W, descending):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(W + 1))[:W]
    p[rng.integers(W)] = 0.0                 # a zero rate exercises the 0 * -inf guard
    if descending:
        p = np.sort(p)[::-1]
    slow = np.array(reference_values(p, N, D))
    for size_bound in (True, False):
        fast = dp_table(p, N, D, size_bound=size_bound).values
        np.testing.assert_allclose(fast[1:, 1:], slow[1:, 1:], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_reconstructed_tree_value_equals_dp_value(seed):
    rng = np.random.default_rng(seed)
    p = np.sort(rng.dirichlet(np.ones(9))[:8])[::-1]
    table = dp_table(p, 120, 12)
    for n, d in [(120, 12), (64, 5), (33, 9), (7, 3), (1, 1)]:
        tree = table.tree(n, d)
        assert len(tree) == n and tree.num_levels <= d
        assert tree.expected_length(p) == pytest.approx(table.values[n, d], rel=1e-12)
    top = optimal_tree(p, 120, 12)
    assert top == table.tree(120, 12)
    assert top.source["expected_length"] == pytest.approx(top.expected_length(p))


def test_value_non_decreasing_in_budget_and_depth():
    p = np.array([0.6, 0.2, 0.1, 0.05])
    G = dp_table(p, 90, 9).values[1:, 1:]
    finite = np.isfinite(G)
    budget_step = np.diff(np.where(finite, G, -1.0), axis=0)
    depth_step = np.diff(np.where(finite, G, -1.0), axis=1)
    assert np.all(budget_step[finite[1:]] >= -1e-12)
    assert np.all(depth_step >= -1e-12)
    # infeasible only where d levels of width 4 cannot hold n nodes
    for d in range(1, 10):
        capacity = sum(4 ** k for k in range(d))
        assert np.all(finite[:capacity, d - 1]) and not np.any(finite[capacity:, d - 1])


@pytest.mark.parametrize("p1", [0.3, 0.75, 0.95])
def test_chain_closed_form(p1):
    n = 9
    closed = sum(p1 ** i for i in range(n))
    assert chain(n).expected_length([p1, 0.01]) == pytest.approx(closed)
    tree = optimal_tree([p1], n, n)          # width 1: only a chain fits
    assert tree == chain(n)
    assert tree.expected_length([p1]) == pytest.approx(closed)
    assert optimal_tree([p1, 0.0, 0.0], n, n + 3) == chain(n)   # only p1 > 0: a chain wins


def test_star_closed_form():
    p = [0.5, 0.2, 0.1, 0.08, 0.05]
    for n in range(1, 7):
        closed = 1 + sum(p[: n - 1])
        assert star(n - 1).expected_length(p) == pytest.approx(closed)
        tree = optimal_tree(p, n, 2)          # two levels: the star is the only shape
        assert tree == star(n - 1)
        assert dp_table(p, n, 2).values[n, 2] == pytest.approx(closed)


def test_specinfer_closed_form():
    p = [0.5, 0.2, 0.1]
    k, depth = 3, 4
    closed = 1 + sum(p[:k]) * sum(p[0] ** j for j in range(depth))
    assert specinfer(k, depth).expected_length(p) == pytest.approx(closed)
    assert optimal_tree(p, len(specinfer(k, depth)), depth + 1).expected_length(p) >= closed


def test_bad_planner_inputs():
    with pytest.raises(RedwoodError, match="no tree of 5 nodes fits in 2 levels"):
        optimal_tree([0.5, 0.3], 5, 2)
    with pytest.raises(RedwoodError, match="budget must be an integer >= 1"):
        optimal_tree([0.5], 0, 3)
    with pytest.raises(RedwoodError, match="max_depth must be an integer >= 1"):
        optimal_tree([0.5], 4, 0)
    with pytest.raises(RedwoodError, match="sum"):
        optimal_tree([0.8, 0.3], 4, 3)
    with pytest.raises(RedwoodError, match="negative"):
        optimal_tree([0.8, -0.1], 4, 3)
    with pytest.raises(RedwoodError, match="empty"):
        optimal_tree([], 4, 3)


# --- hardware-aware choice -----------------------------------------------------------------

FREE = 1e-9            # a "free" draft: profiles need positive times


def _profile(target, draft=None):
    draft = draft or {1: FREE, 1024: FREE}
    return Profile(target_ms=dict(target), draft_ms=dict(draft))


def test_free_draft_and_only_p1_picks_a_chain():
    profile = _profile({1: 100, 2: 101, 4: 102, 8: 103, 16: 104})
    choice = choose_tree([0.9, 0.0, 0.0, 0.0], profile, max_budget=16, max_depth=16)
    assert choice.tree == chain(choice.budget)
    assert choice.budget == 16 and choice.depth == 16


def test_flat_target_takes_largest_measured_budget():
    p = [0.7, 0.15, 0.05, 0.03]
    profile = _profile({1: 50, 3: 50, 10: 50, 20: 50, 40: 50, 80: 50})
    choice = choose_tree(p, profile, max_budget=60, max_depth=8)
    assert choice.budget == 40                       # 80 is above max_budget, 41..60 unmeasured
    assert len(choice.tree) == 40
    assert choice.tokens_per_step == pytest.approx(choice.tree.expected_length(p))
    assert choice.tokens_per_step == pytest.approx(dp_table(p, 40, 8).values[40].max())


BUMPY = {1: 100, 2: 104, 4: 108, 8: 300, 12: 420, 16: 150, 32: 600}


def test_non_monotonic_target_never_picks_a_beaten_budget():
    p = [0.8, 0.1, 0.05]
    smooth = {**BUMPY, 8: 112, 12: 130}
    baseline = choose_tree(p, _profile(smooth), 32, 10)
    assert baseline.budget in (8, 12)                # the bump matters for this p
    choice = choose_tree(p, _profile(BUMPY), 32, 10)
    assert choice.budget not in (8, 12)              # 16 is bigger and faster than both
    assert choice.budget == 16
    for n, t in BUMPY.items():                       # nothing bigger is also at least as fast
        if n > choice.budget:
            assert t > BUMPY[choice.budget]


def test_choice_is_the_best_candidate_computed_by_hand():
    p = [0.85, 0.08, 0.03, 0.01]
    target = {1: 312, 2: 360, 4: 450, 8: 573, 12: 1692, 16: 836, 32: 1400}
    draft = {1: 128, 2: 130, 4: 136, 8: 150, 16: 185}
    profile = _profile(target, draft)
    choice = choose_tree(p, profile, max_budget=32, max_depth=8)
    best_rate, checked = 0.0, 0
    for n in target:
        for d in range(1, 9):
            if sum(4 ** k for k in range(d)) < n:     # no tree of n nodes in d levels
                continue
            tree = optimal_tree(p, n, d)
            widths = tree.level_sizes[:-1]
            if any(w > 16 for w in widths):
                continue
            draft_total = sum(draft[min(m for m in draft if m >= w)] for w in widths)
            best_rate = max(best_rate, tree.expected_length(p) / (target[n] + draft_total))
            checked += 1
    assert checked > 20
    assert choice.tokens_per_step / choice.step_ms == pytest.approx(best_rate, rel=1e-12)
    assert choice.speedup == pytest.approx(choice.tokens_per_step * 312 / choice.step_ms)
    assert choice.budget in target and choice.budget != 12
    assert {c.budget for c in choice.candidates} <= set(target)
    plain = [c for c in choice.candidates if c.budget == 1]
    assert len(plain) == 1 and plain[0].speedup == pytest.approx(1.0)


def test_draft_cost_uses_nearest_measured_width_at_or_above():
    profile = _profile({1: 10}, {1: 5.0, 4: 9.0, 8: 20.0})
    tree = Tree([-1, 0, 0, 1, 1, 2, 3, 3, 3, 3, 3])    # level widths 1, 2, 3, 5 (+ leaves)
    assert tree.level_sizes == [1, 2, 3, 5]
    assert step_draft_ms(tree, profile) == pytest.approx(5.0 + 9.0 + 9.0)  # last level: no draft
    wide = Tree([-1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6])             # widths 1, 2, 4, 8
    assert step_draft_ms(wide, profile) == pytest.approx(5.0 + 9.0 + 9.0)
    deeper = Tree(wide.parents + [7])                # now the width-8 level has a child
    assert step_draft_ms(deeper, profile) == pytest.approx(5.0 + 9.0 + 9.0 + 20.0)
    too_wide = star(9)
    assert step_draft_ms(Tree(too_wide.parents + [1]), profile) is None   # width 9 > 8 measured
    assert step_draft_ms(chain(1), profile) == 0.0


def test_unmeasured_draft_width_skips_candidate():
    # the only 8-node DP tree has a level of 3 nodes, but the draft was timed up to width 2
    profile = _profile({1: 100, 8: 100}, {1: 1.0, 2: 1.0})
    choice = choose_tree([0.3, 0.3, 0.3], profile, max_budget=8, max_depth=4)
    skipped = [(c.budget, c.depth) for c in choice.candidates if c.speedup is None]
    assert skipped == [(8, 3)]
    assert choice.budget == 1 and choice.speedup == 1.0
    wider = _profile({1: 100, 8: 100}, {1: 1.0, 4: 1.0})
    assert choose_tree([0.3, 0.3, 0.3], wider, max_budget=8, max_depth=4).budget == 8


def test_choose_tree_accepts_profile_dict_and_path(tmp_path):
    p = [0.8, 0.1]
    profile = _profile({1: 100, 4: 120}, {1: 10, 4: 12})
    path = profile.save(tmp_path / "profile.json")
    a = choose_tree(p, profile, 4, 4)
    assert choose_tree(p, profile.to_dict(), 4, 4).tree == a.tree
    assert choose_tree(p, path, 4, 4).tree == a.tree
    with pytest.raises(RedwoodError, match="profile must be"):
        choose_tree(p, 42, 4, 4)


def test_public_api_names():
    assert redwood.optimal_tree is optimal_tree and redwood.choose_tree is choose_tree
    assert redwood.Tree is Tree


def test_planner_imports_without_torch():
    src = str(Path(redwood.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = ("import sys, redwood, redwood.plan.planner, redwood.plan.formats, redwood.plan.render, redwood.plan.tree\n"
            "redwood.optimal_tree([0.8, 0.1], 10, 4)\n"
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
