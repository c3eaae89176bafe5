"""Per-step trees grown best-first (decode/tree_growth.py, DraftModelDrafter's growth): the
rule's decisions follow the cost model, greedy output equals plain greedy, sampling stays
exact (chi-square), and the trees really vary from step to step."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from redwood.decode.draft_model import DraftModelDrafter
from redwood.decode.engine import Engine
from redwood.decode.tree_growth import BestFirstGrowth, Calibration
from redwood.plan.formats import ConfidenceBins
from redwood.plan.tree import Tree
from tiny import tiny_model

FLAT = {n: 10.0 for n in range(1, 33)}                 # extra rows are free
STEEP = {1: 30.0, 2: 50.0, 4: 80.0, 8: 170.0, 16: 340.0, 32: 700.0}
MAX_TREE = Tree([-1, 0, 0, 0, 1, 1, 2, 4, 4, 5, 7, 8, 10, 12])


def growth(target_ms, level_ms=1.0, calibration=None):
    return BestFirstGrowth(target_ms, lambda width: level_ms, calibration)


def test_calibration_from_bins_and_fallback():
    bins = ConfidenceBins([0.0, 0.5, 1.0], [20, 3], [18, 3])
    c = Calibration.from_bins(bins)
    assert c(0.1) == pytest.approx(0.9)                # measured: under-confident draft
    assert c(0.7) == 0.7                               # too few observations: c = q
    assert Calibration()(0.3) == 0.3


def test_flat_costs_keep_every_likely_child_and_steep_costs_keep_few():
    top = [[0.6, 0.3, 0.05, 0.05]]
    flat = growth(FLAT, level_ms=0.01)
    assert flat.child_counts([0], top, [4]) == [4]
    # t(1) + the draft's root forward = 55 ms for 1 token; a second row adds 20 ms
    steep = growth(STEEP, level_ms=25.0)
    assert steep.child_counts([0], [[0.3, 0.2, 0.1]], [3]) == [0]    # 1.3 tokens / 75 ms: no
    certain = growth(STEEP, level_ms=25.0)
    assert certain.child_counts([0], [[0.99, 0.01]], [2]) == [1]     # 1.99 / 75 ms: yes


def test_expansion_stops_when_the_next_level_does_not_pay():
    rule = BestFirstGrowth(FLAT, lambda width: 0.5 * width)
    rule.add_children(0, [1, 2], [0.9, 0.05])
    assert rule.to_expand([1, 2]) == [1]                # the likely child, not the unlikely one
    dear = growth(FLAT, level_ms=50.0)
    dear.add_children(0, [1], [0.9])
    assert dear.to_expand([1]) == []


def test_a_live_bar_lets_a_confident_chain_run_past_the_steps_own_rate():
    """Maximising each step's own rate stops a confident chain once the step has earned a
    lot; with the request's live rate as the bar the chain goes on while each level earns
    more than that rate. A bar above the step's own rate changes nothing (the step's rate
    caps it)."""
    chain = Tree([-1] + list(range(30)))

    def levels(bar):
        rule = BestFirstGrowth(GENTLE, lambda width: 2.0, continuation=0.85)
        rule.bar, expanding, level = bar, [0], 0
        while expanding:
            counts = rule.child_counts(expanding, [[0.9, 0.1]], [1])
            if not counts[0]:
                break
            kid = chain.children[expanding[0]][0]
            rule.add_children(expanding[0], [kid], [0.9])
            level += 1
            expanding = rule.to_expand([kid] if chain.children[kid] else [])
            if expanding:
                rule.ran_level(1)
        return level

    alone, live, high = levels(None), levels(0.05), levels(10.0)
    assert 1 < alone and alone + 5 < live, (alone, live)
    assert live < len(chain) - 1                     # the bar still stops it: 0.9^k decays
    assert high == alone


def test_continuation_keeps_a_hesitant_token_worth_expanding():
    """A kept child the draft hesitated on (q = 0.3): its own c(q) says its child is worth
    0.3 · 0.3 of a token, the calibrated continuation 0.3 · 0.85. A level costs 2 ms (one
    target row, one draft forward); the step so far earns 1.3 tokens in 13 ms."""
    costs = {n: 10.0 + n for n in range(1, 33)}
    own = BestFirstGrowth(costs, lambda width: 1.0)
    cont = BestFirstGrowth(costs, lambda width: 1.0, continuation=lambda temperature: 0.85)
    for rule in (own, cont):
        rule.begin(0.6)
        rule.add_children(0, [1], [0.3])
    assert own.to_expand([1]) == []
    assert cont.to_expand([1]) == [1]


def test_costs_between_measured_sizes_are_interpolated():
    from redwood.decode.tree_growth import interpolated_ms

    times = {1: 10.0, 2: 20.0, 16: 34.0, 32: 66.0}
    assert interpolated_ms(times, 2) == 20.0
    assert interpolated_ms(times, 9) == pytest.approx(27.0)
    assert interpolated_ms(times, 24) == pytest.approx(50.0)
    assert interpolated_ms(times, 64) == pytest.approx(132.0)      # scaled beyond


def test_growth_limit_is_the_dp_tree_with_a_long_spine():
    from redwood.measure.growth_plans import GROWTH_SPINE, growth_tree
    from redwood.measure.machine_profile import QUICK_SIZES
    from redwood.plan.formats import Profile
    from redwood.plan.planner import dp_table

    p = [0.8, 0.1, 0.05, 0.02]
    sizes = list(QUICK_SIZES)                        # what a first-use profile measures
    tree = growth_tree(p, Profile(target_ms={n: 100.0 + n for n in sizes},
                                  draft_ms={n: 5.0 for n in sizes}))
    assert len(tree) <= max(sizes) and tree.num_levels == GROWTH_SPINE
    assert set((0,) * k for k in range(1, GROWTH_SPINE)) <= set(tree.paths())
    budget = tree.source["dp_budget"]
    table = dp_table(p, budget, 12)
    depth = max(d for d in range(1, table.max_depth + 1) if table.feasible(budget, d))
    assert set(table.tree(budget, depth).paths()) <= set(tree.paths())
    assert budget > 8                                 # room for width, not only the spine
    small = growth_tree(p, Profile(target_ms={n: 100.0 + n for n in range(1, 9)},
                                   draft_ms={n: 5.0 for n in range(1, 9)}))
    assert len(small) <= 8                            # never past the largest measured size


def grown_engine(target, draft, target_ms=FLAT, level_ms=0.01, governed=False):
    """governed: the engine has a profile, so a governor runs and its live rate is the
    growth rule's bar from the second step on (judged by the profile's costs alone: these tiny
    models' real forwards take nothing like the fictional ones, live_costs=False)."""
    from redwood.plan.formats import Profile

    engine = Engine(target, draft, MAX_TREE, live_costs=False)
    rule = growth(target_ms, level_ms)
    engine.drafter = DraftModelDrafter(engine.draft_backend, time.perf_counter, engine.layouts,
                                       growth=rule)
    if governed:
        engine.profile = Profile(target_ms=dict(target_ms),
                                 draft_ms={n: level_ms for n in target_ms})
    return engine


GENTLE = {n: 10.0 + 0.3 * n for n in range(1, 33)}      # each extra row costs 3% of t(1)


def sizes_of(engine) -> list[int]:
    """Record the size of every proposal the engine's drafter makes."""
    sizes, inner = [], engine.drafter.propose

    def propose(*args, **kwargs):
        proposal = inner(*args, **kwargs)
        sizes.append(len(proposal.layout.tree))
        return proposal
    engine.drafter.propose = propose
    return sizes


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("governed", [False, True])
def test_greedy_equals_autoregressive_and_trees_vary(arch, layers, governed):
    """A sharp target; a 1-layer draft (often wrong) and the same weights (always right)."""
    target = tiny_model(arch, vocab_size=64, seed=1, dtype=torch.float64, scale=30.0)
    draft = tiny_model(arch, vocab_size=64, seed=1, dtype=torch.float64, scale=30.0,
                       num_layers=layers)
    engine = grown_engine(target, draft, target_ms=GENTLE, level_ms=0.3, governed=governed)
    sizes, gains = sizes_of(engine), []
    for seed in range(3):
        prompt = torch.randint(2, 64, (12,), generator=torch.Generator().manual_seed(seed))
        reference = engine.generate(prompt, 24, method="autoregressive", stop_on_eos=False)
        result = engine.generate(prompt, 24, stop_on_eos=False)
        assert result.tokens == reference.tokens, (arch, seed)
        gains.append(result.tokens_per_step)
    assert len(set(sizes)) > 2, sizes                   # grown per step, not one fixed shape
    assert max(sizes) <= len(MAX_TREE)
    if layers == 2:
        assert min(gains) > 1.5, gains                  # a right draft: deep trees, kept
    if governed:                                        # the live rate was the bar
        assert engine.drafter.growth.bar >= 1.0 / GENTLE[1]


@pytest.mark.slow
@pytest.mark.parametrize("temperature, top_p, governed",
                         [(0.6, 1.0, False), (1.0, 1.0, False), (1.0, 0.8, False),
                          (0.6, 1.0, True)])
def test_first_two_tokens_follow_the_target_with_growth(temperature, top_p, governed):
    """governed: the second token's step (after a first step that kept one token) grows
    under a bar set from the first step's outcome."""
    from test_engine_exactness import (ALPHA, PROMPT, SAMPLES, VOCAB, chi_square_pvalue,
                                       exact_joint)

    target = tiny_model("qwen2", vocab_size=VOCAB, seed=21, hidden_size=16, num_layers=1, scale=3.0)
    draft = tiny_model("qwen2", vocab_size=VOCAB, seed=22, hidden_size=16, num_layers=1, scale=3.0)
    engine = grown_engine(target, draft, level_ms=0.5, governed=governed)
    counts, sizes = np.zeros(VOCAB * VOCAB), set()
    for seed in range(SAMPLES):
        result = engine.generate(PROMPT, 2, temperature=temperature, top_p=top_p, seed=seed,
                                 stop_on_eos=False)
        counts[result.tokens[0] * VOCAB + result.tokens[1]] += 1
        sizes.add(result.stats.tree_nodes)
    assert len(sizes) >= 2, "the grown trees never varied: the test would not bite"
    pvalue = chi_square_pvalue(counts, exact_joint(target, temperature, top_p))
    assert pvalue > ALPHA, f"growth T={temperature} top_p={top_p}: p-value {pvalue:.2e}"



def test_growth_is_plain_where_no_tree_of_the_bundle_pays():
    """--grow keeps no draft warm where the planner finds that no tree of the bundle's vector
    beats plain decoding on this machine's costs; where trees pay it grows inside the limit."""
    from redwood.measure.bundles import find_bundle
    from redwood.measure.growth_plans import growth_trees
    from redwood.plan.formats import Profile

    bundle = find_bundle("auto", "qwen2.5-coder", "hf")
    sizes = range(1, 33)
    steep = Profile(target_ms={n: 10.0 * n for n in sizes}, draft_ms={n: 9.0 for n in sizes})
    flat = Profile(target_ms={n: 100.0 + n for n in sizes}, draft_ms={n: 5.0 for n in sizes})
    for temperature in (0.0, 0.6):
        assert len(growth_trees(steep, bundle)(temperature)) == 1
        grown = growth_trees(flat, bundle)(temperature)
        assert len(grown) > 1 and grown.source["kind"] == "growth limit"


@pytest.mark.parametrize("backend", ["hf", "llamacpp"])
def test_shipped_bundles_carry_calibrated_bins_for_every_temperature(backend):
    """Grown trees on either backend size themselves from measured acceptance by draft
    probability, not c(q) = q: every entry of both shipped bundles has confidence bins, and
    the top bin (q >= 0.99) holds enough drafted tokens to be used."""
    from redwood.measure.bundles import load_bundle, shipped_bundle_dir
    from redwood.measure.growth_plans import calibrations

    bundle = load_bundle(shipped_bundle_dir(backend=backend))
    rule = calibrations(bundle)
    for entry in bundle.entries:
        calibration = rule(entry.temperature)
        assert calibration.edges[-2:] == [0.99, 1.0]
        assert calibration.rates[-1] is not None and calibration.rates[-1] > 0.9
        assert calibration(0.995) == calibration.rates[-1] != 0.995
