"""benchmarks/policy_ceiling.py: the replay of drafting policies on a recorded greedy run (pure
python over records; no model)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from redwood.plan.formats import Profile

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "policy_ceiling.py"
SPEC = importlib.util.spec_from_file_location("policy_ceiling_script", PATH)
pc = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(pc)

COSTS = pc.Costs(Profile(target_ms={1: 100.0, 2: 110.0, 4: 130.0, 8: 170.0},
                         draft_ms={1: 10.0, 2: 12.0}))


def record(right, q, second=None):
    """gen = 1000 + i; the draft's top-1 is right where right[i]; its rank-2 token is right
    where second[i]; q[i] its top-1 probability."""
    n = len(right)
    second = second or [False] * n
    gen = [1000 + i for i in range(n)]
    ids = [[g if r else 7, g if s and not r else 8, 9, 10] for g, r, s in zip(gen, right, second)]
    return {"gen": gen, "q_ids": ids, "q": [[p, 0.0, 0.0, 0.0] for p in q]}


def test_costs_interpolate_and_extend_along_the_last_slope():
    assert COSTS.target_ms(1) == 100.0 and COSTS.target_ms(3) == pytest.approx(120.0)
    assert COSTS.target_ms(12) == pytest.approx(170.0 + 10.0 * 4)     # slope 10 ms per row
    assert COSTS.level == {1: 10.0, 2: 12.0}


def test_oracle_chain_drafts_exactly_the_kept_run():
    rec = record([True] * 5 + [False] + [True] * 2, [0.9] * 8)
    assert pc.oracle(rec, 0, COSTS, 1) == (6, COSTS.target_ms(6) + 5 * 10.0)
    assert pc.oracle(rec, 5, COSTS, 1) == (1, 100.0)                   # nothing to draft: plain
    # 6 tokens (5 drafted + the target's own at the miss), then the last 2 drafted + 1
    assert pc.decode_ms(rec, lambda r, i: pc.oracle(r, i, COSTS, 1)) == pytest.approx(
        COSTS.target_ms(6) + 50.0 + COSTS.target_ms(3) + 20.0)


def test_chain_stops_after_a_hesitant_token_and_counts_what_the_target_keeps():
    rec = record([True] * 6, [0.9, 0.9, 0.3, 0.9, 0.9, 0.9])
    tokens, ms = pc.chain(rec, 0, COSTS, tau=0.4, maxd=20, sib=0)
    assert tokens == 4 and ms == pytest.approx(COSTS.target_ms(4) + 3 * 10.0)
    tokens, _ = pc.chain(rec, 0, COSTS, tau=0.2, maxd=4, sib=0)
    assert tokens == 5                                                  # maxd levels, all kept


def test_a_wrong_token_ends_what_is_kept_and_is_charged_its_expected_continuation():
    rec = record([True, False, True, True], [0.9] * 4)
    tokens, ms = pc.chain(rec, 0, COSTS, tau=0.4, maxd=4, sib=0)
    extra = 0.5 + 0.25                                                  # 2 levels left after it
    assert tokens == 2
    assert ms == pytest.approx(COSTS.target_ms(1 + 2 + extra) + (2 + extra) * 10.0)


def test_a_rank_2_leaf_rescues_a_hesitant_level_and_costs_a_node():
    rec = record([True, False, True], [0.9, 0.5, 0.9], second=[False, True, False])
    with_leaf = pc.chain(rec, 0, COSTS, tau=0.1, maxd=2, sib=0.7)
    without = pc.chain(rec, 0, COSTS, tau=0.1, maxd=2, sib=0)
    assert with_leaf[0] == 3 and without[0] == 2
    assert with_leaf[1] == pytest.approx(COSTS.target_ms(4) + 2 * 12.0)   # root, 2 spine, 1 leaf


def test_ratios_are_against_the_assisted_replay():
    recs = [record([True] * 12, [0.95] * 12), record([False] * 6, [0.5] * 6)]
    rows = pc.ratios(pc.replay(recs, COSTS), [300.0, 300.0])
    assert rows["assisted"]["decode_x_assisted"] == 1.0
    assert rows["assisted"]["e2e_x_assisted_worst"] == 1.0
    assert rows["oracle chain"]["decode_x_assisted"] >= 1.0               # nothing beats knowing
    assert rows["oracle top-2"]["decode_x_assisted"] >= rows["oracle chain"]["decode_x_assisted"]
    best = next(k for k in rows if k.startswith("best chain"))
    assert rows[best]["decode_x_assisted"] >= 1.0                         # the grid holds assisted's neighbours
