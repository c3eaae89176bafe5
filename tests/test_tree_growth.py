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


def grown_engine(target, draft, target_ms=FLAT, level_ms=0.01):
    engine = Engine(target, draft, MAX_TREE)
    engine.drafter = DraftModelDrafter(engine.draft_backend, time.perf_counter, engine.layouts,
                                       growth=growth(target_ms, level_ms))
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
def test_greedy_equals_autoregressive_and_trees_vary(arch, layers):
    """A sharp target; a 1-layer draft (often wrong) and the same weights (always right)."""
    target = tiny_model(arch, vocab_size=64, seed=1, dtype=torch.float64, scale=30.0)
    draft = tiny_model(arch, vocab_size=64, seed=1, dtype=torch.float64, scale=30.0,
                       num_layers=layers)
    engine = grown_engine(target, draft, target_ms=GENTLE, level_ms=0.3)
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


@pytest.mark.slow
@pytest.mark.parametrize("temperature, top_p", [(0.6, 1.0), (1.0, 1.0), (1.0, 0.8)])
def test_first_two_tokens_follow_the_target_with_growth(temperature, top_p):
    from test_engine_exactness import (ALPHA, PROMPT, SAMPLES, VOCAB, chi_square_pvalue,
                                       exact_joint)

    target = tiny_model("qwen2", vocab_size=VOCAB, seed=21, hidden_size=16, num_layers=1, scale=3.0)
    draft = tiny_model("qwen2", vocab_size=VOCAB, seed=22, hidden_size=16, num_layers=1, scale=3.0)
    engine = grown_engine(target, draft, level_ms=0.5)
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
