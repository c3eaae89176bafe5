"""Live step costs (plan/live_costs.py): the profile corrected by what a request's forwards take.
Pure logic first, then the governor and the n-gram drafter on it, then the engine on an injected
clock: steps that take 1.5x their prediction turn a request plain within a few steps; steps that
take what was predicted keep it drafting; the output is the target's greedy output either way."""
from __future__ import annotations

import math

import pytest
import torch

from redwood.backends.hf import HFBackend
from redwood.decode.engine import Engine
from redwood.decode.governor import Governor
from redwood.decode.ngram_drafter import NgramDrafter
from redwood.plan.formats import Profile
from redwood.plan.live_costs import DRAFT, LiveCosts
from redwood.plan.tree import chain
from tiny import tiny_model

PROFILE_MS = {1: 30.0, 2: 45.0, 3: 70.0, 4: 80.0, 8: 160.0}


def test_ratio_learnt_per_measured_size_and_clipped():
    costs = LiveCosts(PROFILE_MS)
    assert costs.ratio(4) == costs.ratio(1) == 1.0             # nothing timed: the profile
    for _ in range(20):
        costs.record_target(4, 0.120)                          # 1.5x the 80 ms predicted
    assert costs.ratio(4) == pytest.approx(1.5, rel=0.05)
    assert costs.target_ms(3) == pytest.approx(70.0 * costs.ratio(4))   # untimed 3 borrows
    assert costs.size_key(5) == 8 and costs.size_key(20) == 8
    assert costs.predicted_ms(16) == pytest.approx(320.0)      # linear beyond the largest
    costs.record_target(1, 30.0)                               # a 1000x outlier
    assert costs.ratio(1) <= 4.0 ** (1 / 1.5) + 1e-9           # clipped at high, shrunk by the prior


def test_the_cost_table_is_target_ms_at_every_size_and_follows_records_and_rebases():
    costs = LiveCosts(PROFILE_MS)
    assert costs.table() == PROFILE_MS
    costs.record_target(4, 0.120)                              # 1.5x at size 4
    costs.record_target(1, 0.024)                              # 0.8x plain
    assert costs.table() == pytest.approx({n: costs.target_ms(n) for n in PROFILE_MS})
    assert costs.table()[4] > 80.0 and costs.table()[1] < 30.0
    costs.rebase({n: 2 * ms for n, ms in PROFILE_MS.items()})  # a longer context
    assert costs.table() == pytest.approx({n: costs.target_ms(n) for n in PROFILE_MS})
    assert costs.table()[8] > 320.0 * 0.99


def test_untimed_sizes_borrow_from_timed_speculative_sizes_but_plain_does_not():
    costs = LiveCosts(PROFILE_MS)
    for _ in range(10):
        costs.record_target(4, 0.160)                          # 2x at size 4
    assert costs.ratio(8) == pytest.approx(2.0, rel=0.01)       # never timed: the pooled 2x
    assert costs.ratio(1) == 1.0                               # plain keeps the profile
    assert costs.ratio(DRAFT) == 1.0
    costs.record_draft(20.0, 0.010)
    assert costs.ratio(DRAFT) < 1.0
    assert costs.as_dict()["samples"] == {"4": 10, DRAFT: 1}


def test_before_any_tree_is_timed_trees_borrow_the_plain_steps_error():
    """A profile reading every size 15 % high: once plain steps are timed at 0.85, an untimed
    tree must not look 1 / 0.85 dearer than it is (a self-sizing drafter would never try one),
    and once a tree size is timed, its own error decides."""
    costs = LiveCosts(PROFILE_MS)
    for _ in range(10):
        costs.record_target(1, 0.85 * 0.030)
    assert costs.ratio(1) == pytest.approx(0.85, rel=0.03)
    assert costs.ratio(4) == pytest.approx(costs.ratio(1), rel=0.03)
    assert costs.target_ms(4) / costs.target_ms(1) == pytest.approx(80.0 / 30.0, rel=0.05)
    for _ in range(10):
        costs.record_target(4, 1.2 * 0.080)
    assert costs.ratio(8) == pytest.approx(1.2, rel=0.05)       # the timed tree size's 1.2x


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        LiveCosts({2: 10.0})
    with pytest.raises(ValueError):
        LiveCosts(PROFILE_MS, decay=1.0)
    assert not LiveCosts(PROFILE_MS).record_target(4, 0.0)


def _run_governor(spec_factor: float, plain_factor: float = 1.0, steps: int = 40):
    """A governor on live costs whose speculative steps (3 nodes, 3 tokens kept: predicted
    3 / 70 ms against 1 / 30 ms plain, a 1.29x gain) take spec_factor x their prediction."""
    costs = LiveCosts(PROFILE_MS)
    g = Governor(plain_ms=30.0, prior_tokens_per_ms=1 / 30.0, costs=costs)
    decisions = []
    for _ in range(steps):
        go = g.speculate()
        decisions.append(go)
        if go:
            costs.record_target(3, spec_factor * 0.070)
            g.record(3, costs.target_ms(3))
        else:
            costs.record_target(1, plain_factor * 0.030)
    return decisions


def test_governor_turns_plain_within_a_few_steps_when_steps_cost_1_5x():
    decisions = _run_governor(1.5)
    first_plain_run = next(i for i in range(len(decisions) - 3) if not any(decisions[i:i + 3]))
    assert first_plain_run <= 6
    assert sum(decisions) <= 12                 # then mostly plain, with probes


def test_governor_keeps_drafting_when_steps_cost_what_was_predicted():
    decisions = _run_governor(1.0)
    assert decisions.count(False) <= 2          # only the plain steps that re-time t(1)


def test_common_error_cancels():
    """Every step 1.5x slower (a longer context than the profile's): speculation still pays."""
    assert _run_governor(1.5, plain_factor=1.5).count(False) <= 2


def test_ngram_best_size_uses_live_costs():
    drafter = NgramDrafter(target_ms=PROFILE_MS)
    values = [0.9, 0.8, 0.7]                    # E(4) = 3.4: 3.4 / 80 beats 1 / 30
    assert drafter.best_size(values, 8)[0] == 4
    drafter.costs = LiveCosts(PROFILE_MS)
    for _ in range(10):
        drafter.costs.record_target(4, 0.240)   # 3x: 3.4 / 240 loses to 1 / 30
    assert drafter.best_size(values, 8)[0] == 1


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedBackend:
    """A real (tiny) backend whose forwards advance a fake clock by factor(n) x t(n) of a
    profile, n = the tokens of the forward. Not fused: the engine prefills the whole prompt."""

    fused_prefill_tree = False

    def __init__(self, inner, clock: FakeClock, profile_ms: dict, spec_factor: float):
        self._inner, self._clock, self._spec = inner, clock, spec_factor
        self._costs = LiveCosts(profile_ms)

    def __getattr__(self, name):
        if name == "prefill_tree":
            raise AttributeError(name)
        return getattr(self._inner, name)

    def _advance(self, n: int) -> None:
        self._clock.now += self._costs.predicted_ms(n) / 1000.0 * (self._spec if n > 1 else 1.0)

    def append(self, ids, rows: int = 1):
        self._advance(len(ids))
        return self._inner.append(ids, rows)

    def run_tree(self, tree, nodes, tokens, root_position, rows=None):
        self._advance(len(list(nodes)))
        return self._inner.run_tree(tree, nodes, tokens, root_position, rows)

    def keep_path(self, nodes):
        return self._inner.keep_path(nodes)


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("qwen2", vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)


@pytest.mark.parametrize("spec_factor, most_plain", [(1.5, 16), (1.0, 2)])
def test_engine_on_an_injected_clock(tiny, spec_factor, most_plain):
    """The draft is the target itself (every draft accepted: 3 tokens per 3-node step), so on
    the profile a step pays 1.29x; at 1.5x its prediction it loses."""
    clock = FakeClock()
    profile = Profile(target_ms=PROFILE_MS, draft_ms={1: 1e-3})
    target = TimedBackend(HFBackend(tiny), clock, PROFILE_MS, spec_factor)
    engine = Engine(target, HFBackend(tiny), chain(3), profile=profile, clock=clock)
    prompt = torch.tensor([5, 6, 7, 8])
    result = engine.generate(prompt, 60, stop_on_eos=False)
    reference = Engine(HFBackend(tiny), HFBackend(tiny), chain(3)).generate(
        prompt, 60, method="autoregressive", stop_on_eos=False)
    assert result.tokens == reference.tokens
    steps = result.stats.target_forwards
    if spec_factor > 1:
        assert result.stats.plain_steps >= most_plain, result.stats.governor
        ratios = result.stats.governor["step_cost_ratios"]
        assert math.isclose(ratios["3"], 1.5, rel_tol=0.1)
    else:
        assert result.stats.plain_steps <= most_plain, result.stats.governor
        assert steps <= 60 / 3 + 4
    assert engine.last_costs is not None


def test_live_costs_can_be_turned_off(tiny):
    clock = FakeClock()
    profile = Profile(target_ms=PROFILE_MS, draft_ms={1: 1e-3})
    target = TimedBackend(HFBackend(tiny), clock, PROFILE_MS, 1.5)
    engine = Engine(target, HFBackend(tiny), chain(3), profile=profile, clock=clock,
                    live_costs=False)
    result = engine.generate(torch.tensor([5, 6, 7, 8]), 60, stop_on_eos=False)
    assert result.stats.plain_steps == 0         # the profile alone says drafting pays
    assert "step_cost_ratios" not in result.stats.governor


def test_follow_rebases_on_the_profile_at_the_requests_context():
    tables = {0: PROFILE_MS, 64: {n: 2.0 * ms for n, ms in PROFILE_MS.items()}}
    asked = []

    def table_at(context):
        asked.append(context)
        return tables[min(context, 64)]

    costs = LiveCosts(PROFILE_MS, table_at=table_at, context=10)
    for _ in range(10):
        costs.record_target(4, 0.160)                     # 2x the 80 ms at the prompt's context
    costs.follow(63)                                      # same bucket: nothing re-read
    assert asked == [] and costs.target_ms(4) == pytest.approx(160.0, rel=0.01)
    costs.follow(64)                                      # the context doubled every t(n)
    assert asked == [64] and costs.predicted_ms(4) == 160.0
    for _ in range(30):
        costs.record_target(4, 0.160)                     # as the longer context predicts
    assert costs.ratio(4) == pytest.approx(1.0, rel=0.02)   # not counted twice
    costs.follow(100)
    assert asked == [64]
    with pytest.raises(ValueError):
        costs.rebase({1: 1.0, 2: 2.0})                    # other sizes
    LiveCosts(PROFILE_MS).follow(10_000)                  # no table_at: nothing to follow


class RecordingBackend:
    """Counts the tree sizes the engine verifies (every other call goes to the backend); not
    fused: the whole prompt's prefill gives the first token."""

    fused_prefill_tree = False

    def __init__(self, inner):
        self._inner, self.tree_sizes = inner, []

    def __getattr__(self, name):
        if name == "prefill_tree":
            raise AttributeError(name)
        return getattr(self._inner, name)

    def run_tree(self, tree, nodes, tokens, root_position, rows=None):
        self.tree_sizes.append(len(tree))
        return self._inner.run_tree(tree, nodes, tokens, root_position, rows)


@pytest.mark.parametrize("temperature", [0.0, 0.6])
def test_a_self_sizing_ngram_drafter_is_not_governed(temperature):
    """An n-gram drafter with a cost model picks every step's size itself: the governor never
    makes a step plain (its history would stall drafting after one miss in a copy), a step
    that drafts nothing runs as a plain step (no 1-node tree forward), and greedy output is
    the target's own."""
    # a sharp target (large logits): its sampled answers at 0.6 still copy, as real ones do
    tiny = tiny_model("qwen2", vocab_size=96, seed=1, dtype=torch.float64, scale=30.0)
    profile = Profile(target_ms=PROFILE_MS, draft_ms={1: 1e-3})
    target = RecordingBackend(HFBackend(tiny))
    drafter = NgramDrafter(target_ms=PROFILE_MS, max_length=8)
    assert drafter.sizes_itself and not NgramDrafter().sizes_itself
    engine = Engine(target, None, chain(8), profile=profile, drafter=drafter)
    # a start and the target's own continuation of it, which falls into cycles: the answer
    # repeats long spans the prompt holds, so the n-gram drafter finds matches (and misses)
    start = torch.tensor([5, 6, 7, 8, 9, 5, 6, 7])
    own = Engine(HFBackend(tiny), HFBackend(tiny)).generate(
        start, 40, method="autoregressive", stop_on_eos=False).tokens
    prompt = torch.cat([start, torch.tensor(own)])
    result = engine.generate(prompt, 40, temperature=temperature, seed=3, stop_on_eos=False)
    assert result.stats.governor["plain_steps"] == 0           # never asked to go plain
    assert 1 not in target.tree_sizes                          # no 1-node tree forwards
    drafted = len(target.tree_sizes)
    # the first token comes from the prefill; every later step is plain or verifies a tree
    assert result.stats.plain_steps + drafted + 1 == result.stats.target_forwards
    assert result.stats.plain_steps > 0 and drafted > 0
    by_match = result.as_dict()["acceptance_by_match"]             # every drafted node, once
    assert sum(proposed for _, proposed in by_match.values()) == result.stats.tree_nodes
    assert 0 < sum(kept for kept, _ in by_match.values()) <= result.stats.tree_nodes
    if temperature == 0:
        reference = Engine(HFBackend(tiny), HFBackend(tiny)).generate(
            prompt, 40, method="autoregressive", stop_on_eos=False)
        assert result.tokens == reference.tokens
