"""The governor: speculate only while it pays on this request. Pure logic, then the engine:
output unchanged (greedy equality, chi-square exactness with plain steps interleaved), plain
steps where drafts fail, none where they succeed. The engine tests here judge by the profiles
they give (live_costs=False); tests/test_live_costs.py covers costs read from the clock."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from redwood.decode.engine import Engine
from redwood.decode.governor import Governor, step_ms
from redwood.plan.formats import Profile
from redwood.plan.tree import Tree, chain
from test_engine_exactness import ALPHA, PROMPT, VOCAB, chi_square_pvalue, exact_joint
from tiny import tiny_model

FLAT = Profile(target_ms={n: 30.0 + 0.1 * n for n in range(1, 17)}, draft_ms={n: 0.5 for n in range(1, 17)})
STEEP = Profile(target_ms={n: 30.0 * n for n in range(1, 17)}, draft_ms={n: 20.0 for n in range(1, 17)})


def test_switches_off_when_speculation_loses_and_probes_again():
    g = Governor(plain_ms=30.0, prior_tokens_per_ms=1 / 30.0, probe_every=4)
    decisions = []
    for _ in range(30):
        go = g.speculate()
        decisions.append(go)
        if go:
            g.record(1, 120.0)                 # one token for four tokens' worth of time
    assert decisions[0] and not all(decisions[3:])
    assert sum(decisions) <= 10                 # mostly plain after the first steps
    assert any(decisions[10:])                  # it keeps probing


def test_keeps_speculating_while_it_pays():
    g = Governor(plain_ms=30.0, prior_tokens_per_ms=1 / 30.0)
    for _ in range(30):
        assert g.speculate()
        g.record(3, 45.0)


def test_step_ms_counts_only_the_levels_the_draft_ran():
    tree = chain(4)
    assert step_ms(STEEP, tree, 0) == STEEP.target_ms[4]
    assert step_ms(STEEP, tree, 3) == STEEP.target_ms[4] + 3 * 20.0


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("qwen2", vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    bad = tiny_model("qwen2", vocab_size=96, seed=9, dtype=torch.float64, scale=4.0)
    return target, bad


def test_plain_steps_where_drafts_fail_and_output_unchanged(pair):
    target, bad = pair
    prompt = torch.tensor([5, 6, 7, 8])
    reference = Engine(target, bad, chain(4)).generate(prompt, 40, method="autoregressive",
                                                       stop_on_eos=False)
    governed = Engine(target, bad, chain(4), profile=STEEP, live_costs=False).generate(prompt, 40, stop_on_eos=False)
    assert governed.tokens == reference.tokens
    assert governed.stats.plain_steps > 20
    good = Engine(target, target, chain(4), profile=FLAT, live_costs=False).generate(prompt, 40, stop_on_eos=False)
    assert good.tokens == reference.tokens and good.stats.plain_steps == 0


def test_seeded_sampling_stays_reproducible_with_the_governor(pair):
    target, bad = pair
    engine = Engine(target, bad, chain(4), profile=STEEP, live_costs=False)
    runs = [engine.generate(torch.tensor([3, 4]), 30, temperature=1.0, seed=5,
                            stop_on_eos=False).tokens for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.slow
@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.6, 0.8)])
def test_exact_with_plain_steps_interleaved(temperature, top_p):
    """A governor that turns speculation off after a poor first step: the second token then
    often comes from a plain step. The joint law of the first two tokens stays the target's."""
    target = tiny_model("qwen2", vocab_size=VOCAB, seed=21, hidden_size=16, num_layers=1, scale=3.0)
    draft = tiny_model("qwen2", vocab_size=VOCAB, seed=22, hidden_size=16, num_layers=1, scale=3.0)
    engine = Engine(target, draft, Tree([-1, 0, 0]), profile=STEEP, live_costs=False)
    counts = np.zeros(VOCAB * VOCAB)
    plain = 0
    for seed in range(1200):
        result = engine.generate(PROMPT, 2, temperature=temperature, top_p=top_p, seed=seed,
                                 stop_on_eos=False)
        counts[result.tokens[0] * VOCAB + result.tokens[1]] += 1
        plain += result.stats.plain_steps
    assert plain > 100, "the governor never chose a plain step: the test would not exercise it"
    pvalue = chi_square_pvalue(counts, exact_joint(target, temperature, top_p))
    assert pvalue > ALPHA, f"T={temperature} top_p={top_p}: p-value {pvalue:.2e}"
