"""The batch planner's live step-time correction (plan/step_costs.py) and LiveAcceptance's probe
backoff, pure: step times are injected as multiples of the plan's own prediction, nothing is
timed. The scheduler end to end (tiny GGUF models, a fake clock) is in test_batching_server.py.
"""
from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redwood.plan.batch_planner import BatchPlanner, LiveAcceptance
from redwood.plan.formats import Profile
from redwood.plan.step_costs import StepCosts
from redwood.plan.tree import Tree

P = (0.7, 0.1, 0.05)


def profile(per_token: float, base: float, draft: float) -> Profile:
    """t(N) = base + per_token * N ms for the target, `draft` times that for the draft."""
    sizes = range(1, 129)
    return Profile({n: base + per_token * n for n in sizes},
                   {n: draft * (base + per_token * n) for n in sizes})


# A lone request's best tree is predicted 17 % faster than plain decoding: a marginal plan.
MARGINAL = profile(0.5, 10.0, 0.4)


def run(planner: BatchPlanner, spec_factor: float, steps: int, batch: int = 1) -> list[bool]:
    """Plan `steps` steps; each takes its prediction x spec_factor if it speculates, exactly its
    prediction if plain. Returns whether each step speculated."""
    kinds = []
    for _ in range(steps):
        plan = planner.plan([P] * batch)
        kinds.append(plan.speculative)
        factor = spec_factor if plan.speculative else 1.0
        planner.observe(plan, factor * plan.step_ms / 1000.0)
    return kinds


def test_a_marginal_plan_turns_plain_when_speculation_costs_more():
    """Speculative steps taking 1.5x their prediction: the planner runs plain within 6 steps and
    stays plain; steps taking what was predicted: it keeps speculating."""
    planner = BatchPlanner(MARGINAL, 16, 8, 4, 40)
    plan = planner.plan([P])
    assert plan.speculative and plan.tokens_per_second == pytest.approx(
        1.17 * 1000 / MARGINAL.target_ms[1], rel=0.01)
    kinds = run(planner, 1.5, 40)
    assert kinds[0] and not kinds[6] and not any(kinds[kinds.index(False):])
    ratios = planner.costs.ratios
    assert ratios["plain"] == pytest.approx(1.0) and 1.17 < ratios["speculative"] < 1.5
    assert planner.costs.steps == {"speculative": kinds.index(False),
                                   "plain": 40 - kinds.index(False)}
    honest = BatchPlanner(MARGINAL, 16, 8, 4, 40)
    assert all(run(honest, 1.0, 40)) and all(run(honest, 1.0, 10, batch=2))
    assert honest.costs.ratios == {"speculative": 1.0, "plain": 1.0}


def test_only_the_ratio_of_the_two_kinds_matters():
    """Every step 1.5x slower than predicted (a busier machine than the profile's): plain steps
    are tried while only speculative ones were seen slow, then both ratios are known and the
    marginal plan speculates again for good. Plain steps 4x slower than predicted on a profile
    where plain decoding wins make speculation the better plan within 2 steps."""
    def kinds(planner, batch, factor):
        out = []
        for _ in range(80):
            plan = planner.plan([P] * batch)
            out.append(plan.speculative)
            planner.observe(plan, factor(plan.speculative) * plan.step_ms / 1000.0)
        return out

    planner = BatchPlanner(MARGINAL, 16, 8, 4, 40)
    slow = kinds(planner, 1, lambda speculative: 1.5)
    assert sum(slow) >= 64 and all(slow[-30:]) and not all(slow)
    assert min(planner.costs.ratios.values()) > 1.2
    steep = BatchPlanner(profile(5.0, 1.0, 0.1), 16, 8, 4, 40)
    assert not steep.plan([P] * 4).speculative
    assert all(kinds(steep, 4, lambda speculative: 1.0 if speculative else 4.0)[2:])


def test_step_costs_arithmetic():
    """Decayed geometric mean from 1.0; samples clipped to [0.5, 4] (one outlier moves it by at
    most 4 ** 0.1); steps without a prediction or time are ignored; decay 1 never moves."""
    costs = StepCosts()
    assert costs.ratios == {"speculative": 1.0, "plain": 1.0}
    assert not costs.record(True, None, 0.01) and not costs.record(True, 10.0, 0.0)
    assert costs.steps == {"speculative": 0, "plain": 0}
    assert costs.record(True, 10.0, 1.0)                          # 100x: clipped to 4
    assert costs.ratios["speculative"] == pytest.approx(4 ** 0.1)
    assert costs.ratios["plain"] == 1.0 and costs.steps["speculative"] == 1
    costs.record(False, 10.0, 0.0001)                             # 0.01x: clipped to 0.5
    assert costs.ratios["plain"] == pytest.approx(0.5 ** 0.1)
    for _ in range(200):
        costs.record(True, 10.0, 0.02)
    assert costs.ratios["speculative"] == pytest.approx(2.0)
    assert costs.quantised() == (pytest.approx(math.exp(0.7)), pytest.approx(math.exp(-0.05)))
    frozen = StepCosts(decay=1.0)
    frozen.record(True, 10.0, 0.04)
    assert frozen.ratios["speculative"] == 1.0
    with pytest.raises(ValueError):
        StepCosts(decay=1.5)


def test_plan_cache_key_holds_the_quantised_ratios():
    """A change of the correction below the quantum reuses the cached plan; one that crosses
    it replans (and the plan carries the ratio it was rated with)."""
    planner = BatchPlanner(MARGINAL, 16, 8, 4, 40)
    first = planner.plan([P])
    planner.observe(first, 1.01 * first.step_ms / 1000.0)        # log ratio 0.001: same level
    again = planner.plan([P])
    assert len(planner._plans) == 1 and again.ratio == first.ratio == 1.0
    for _ in range(3):
        planner.observe(first, 1.5 * first.step_ms / 1000.0)
    moved = planner.plan([P])
    assert len(planner._plans) == 2 and moved.ratio == pytest.approx(math.exp(0.1))
    assert moved.tokens_per_second == pytest.approx(first.tokens_per_second / moved.ratio)


def test_the_last_plan_is_reused_only_while_what_was_asked_is_unchanged():
    """plan() answers a repeated question (same vectors, same lags once clipped, same quantised
    ratios) with its last answer, and anything else afresh, as a new planner would."""
    planner = BatchPlanner(MARGINAL, 16, 8, 4, 40)
    lagging = planner.plan([P], [40])
    assert planner.plan([P], [40]) is lagging and planner.plan([P], [99]) is lagging  # clipped
    first = planner.plan([P])
    assert first is not lagging and planner.plan([P], [0]) is first      # None = no lag
    other = (0.3, 0.1)
    assert planner.plan([other]).trees == BatchPlanner(MARGINAL, 16, 8, 4, 40).plan([other]).trees
    assert planner.plan([P]) is not first                     # asked something else between
    for _ in range(3):
        planner.observe(first, 1.5 * first.step_ms / 1000.0)     # crosses a quantum
    moved = planner.plan([P])
    assert moved.ratio == pytest.approx(math.exp(0.1))
    fresh = BatchPlanner(MARGINAL, 16, 8, 4, 40, costs=planner.costs).plan([P])
    assert moved.trees == fresh.trees and moved.tokens_per_second == fresh.tokens_per_second


def test_live_vector_and_quantised_ratios_follow_every_record():
    """LiveAcceptance.p and StepCosts.quantised are kept between records (asked every step)
    and change with the next one."""
    live = LiveAcceptance(P)
    before = live.p
    assert live.p is before
    tree = Tree([-1, 0, 0, 1])
    live.record(tree, [0, 2])                  # the rank-2 child kept: p_2 rises, p_1 falls
    assert live.p != before and live.p[0] < before[0]
    costs = StepCosts()
    q = costs.quantised()
    assert costs.quantised() is q
    for _ in range(3):
        costs.record(False, 10.0, 0.02)        # twice the prediction
    assert costs.quantised()[1] > q[1] == 1.0


def drive(live: LiveAcceptance, decide, steps: int) -> list[int]:
    """`steps` plans of one request: decide(probing) -> whether the plan gave it a tree.
    Returns the steps (indices) that were probes."""
    probes = []
    for i in range(steps):
        probing = live.probing
        if probing:
            probes.append(i)
        live.planned(decide(probing))
    return probes


def test_probe_backoff_doubles_after_failed_probes_and_resets():
    """A probe whose tree is followed by a plain step doubles the interval (8, 16, 32, 64, 64);
    a probe the planner answers plain changes nothing; 3 speculative steps in a row reset it,
    fewer do not."""
    live = LiveAcceptance(P)
    probes = drive(live, lambda probing: probing, 8 + 17 + 33 + 65 + 65 + 1)
    assert probes == [8, 25, 58, 123, 188] and live.interval == 64
    live = LiveAcceptance(P)
    drive(live, lambda probing: False, 20)                 # probes the planner answers plain
    assert live.interval == 8 and live.probing
    live = LiveAcceptance(P)
    drive(live, lambda probing: probing, 9 + 17 + 1)       # two failed probes: 32
    assert live.interval == 32
    script = iter([True, True, False])                     # a probe, 1 more tree, then plain
    drive(live, lambda probing: next(script, False) if probing or live.speculative_run else False,
          32 + 3)
    assert live.interval == 64
    script = iter([True, True, True])                      # a probe that pays: 3 trees in a row
    drive(live, lambda probing: next(script, False) if probing or live.speculative_run else False,
          64 + 3)
    assert live.interval == 8 and not live.probed
    assert not LiveAcceptance((0.0,)).probing               # autoregressive: never a probe


def test_step_time_ratios_are_exported():
    """redwood_batch_step_time_ratio{kind} shows the planner's learnt ratios."""
    from redwood.serve.batch_worker import BatchMetrics
    from redwood.serve.metrics import ServerMetrics

    metrics = ServerMetrics()
    batch = BatchMetrics(metrics)
    costs = StepCosts()
    costs.record(True, 10.0, 0.02)
    batch.observe_costs(costs)
    batch.observe_costs(None)                              # a fixed tree: nothing changes
    samples = {s.labels["kind"]: s.value
               for family in text_string_to_metric_families(metrics.render().decode())
               for s in family.samples if s.name == "redwood_batch_step_time_ratio"}
    assert samples == {"speculative": pytest.approx(2 ** 0.1), "plain": 1.0}
