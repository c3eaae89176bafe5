"""plan/joint_sizes.py: drafted nodes per request when several share one target decode.

Checked against brute force (every allocation of per-request prefixes), against the lone rule
E(n) / t(n) for one request, and on the case it exists for: on a steep CPU cost curve eight
requests with good copies draft far less each than one alone would."""
from __future__ import annotations

import itertools
import random

import pytest

from redwood.decode.ngram_drafter import DRAFT_MARGIN, NgramDrafter
from redwood.plan.joint_sizes import joint_sizes


def rate(values, taken, step_ms, fixed=0):
    lanes = len(values) + fixed
    expected = lanes + sum(sum(v[:k]) for v, k in zip(values, taken))
    return expected / step_ms(lanes + sum(taken))


def brute_force(values, step_ms, fixed=0, max_total=None):
    lanes = len(values) + fixed
    best, best_rate = None, None
    for taken in itertools.product(*(range(len(v) + 1) for v in values)):
        if max_total is not None and lanes + sum(taken) > max_total:
            continue
        r = rate(values, taken, step_ms, fixed)
        if best_rate is None or r > best_rate * (1 + 1e-9):
            best, best_rate = taken, r
    return best, best_rate


def random_values(rng, n):
    """A request's path values, best first: products of acceptance rates, non-increasing."""
    out, v = [], 1.0
    for _ in range(n):
        v *= rng.uniform(0.3, 1.0)
        out.append(v)
    return sorted(out, reverse=True)


def steep(total):                 # a 2-core CPU: verifying k tokens costs nearly k single steps
    return 37.0 * total ** 0.85


def flat(total):                  # a GPU-like curve: extra tokens nearly free
    return 20.0 + 0.05 * total


@pytest.mark.parametrize("step_ms", [steep, flat, lambda t: 30.0 + 12.0 * t])
def test_joint_sizes_reach_the_brute_force_optimum(step_ms):
    rng = random.Random(7)
    for _ in range(60):
        values = [random_values(rng, rng.randint(0, 5)) for _ in range(rng.randint(1, 3))]
        fixed = rng.randint(0, 2)
        max_total = rng.choice([None, len(values) + fixed + rng.randint(0, 6)])
        got = joint_sizes(values, step_ms, fixed, max_total)
        _, best_rate = brute_force(values, step_ms, fixed, max_total)
        assert len(got) == len(values)
        assert all(0 <= k <= len(v) for k, v in zip(got, values))
        if max_total is not None:
            assert len(values) + fixed + sum(got) <= max_total
        assert rate(values, got, step_ms, fixed) == pytest.approx(best_rate, rel=1e-9)


def test_one_request_is_the_lone_rule():
    """Alone, the joint choice is the n that maximises E(n) / t(n), E(n) = 1 + the first n - 1
    values (the n-gram drafter's own rule), margin included."""
    values = [0.95, 0.9, 0.85, 0.8, 0.5, 0.3, 0.2, 0.1]
    for step_ms in (steep, flat):
        lone = max(range(1, len(values) + 2),
                   key=lambda n: ((1 + sum(values[:n - 1])) / step_ms(n), -n))
        assert joint_sizes([values], step_ms) == [lone - 1]
    drafter = NgramDrafter(target_ms={n: steep(n) for n in range(1, 10)})
    for first in (0.3, 0.5, 0.6, 0.7, 0.9):
        values = [first ** (i + 1) for i in range(8)]
        n, _ = drafter.best_size(values, 9)
        assert joint_sizes([values], steep, margin=drafter.margin) == [n - 1]


def test_the_margin_keeps_a_barely_faster_batch_plain():
    """Two requests whose drafts make the shared step 5 % faster on paper: drafted without a
    margin, plain with DRAFT_MARGIN (10 %), drafted again when they make it 20 % faster."""
    step = lambda total: 10.0 * total ** 0.5 + 10.0        # t(2) = 24.1, t(4) = 30
    plain_rate = 2 / step(2)
    # one node each: (2 + 2c) / t(4) = 1.05 * plain_rate
    c = (1.05 * plain_rate * step(4) - 2) / 2
    assert joint_sizes([[c], [c]], step) == [1, 1]
    assert joint_sizes([[c], [c]], step, margin=DRAFT_MARGIN) == [0, 0]
    c = (1.2 * plain_rate * step(4) - 2) / 2
    assert joint_sizes([[c], [c]], step, margin=DRAFT_MARGIN) == [1, 1]


def test_eight_requests_on_a_steep_curve_draft_less_than_one_alone():
    copy = [0.97 ** (i + 1) for i in range(16)]        # a long, confident copy
    step = lambda total: 30.0 + 25.0 * total           # nearly linear: t(8) ~ 6 t(1)
    alone = joint_sizes([copy], step)[0]
    together = joint_sizes([copy] * 8, step)
    assert alone > 0                                    # alone, the copy pays
    assert sum(together) < 8 * alone                    # together, most of it does not
    # and the joint choice is at least as good for the batch as everyone's lone choice
    assert rate([copy] * 8, together, step) >= rate([copy] * 8, [alone] * 8, step)


def test_weak_drafts_stay_plain_and_nothing_is_empty():
    assert joint_sizes([], steep) == []
    assert joint_sizes([[], []], steep) == [0, 0]
    assert joint_sizes([[0.05, 0.01], [0.1]], steep, fixed=3) == [0, 0]
    assert joint_sizes([[0.99] * 4], flat, max_total=3) == [2]     # the decode's room bounds it
