"""benchmarks/copy_ceiling.py's copy-limited oracle: drafts only spans its sources hold (pure
python; no model)."""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "copy_ceiling.py"
SPEC = importlib.util.spec_from_file_location("copy_ceiling_script", PATH)
cc = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(cc)

COSTS = {1: 100.0, 2: 110.0, 4: 130.0, 8: 170.0}


def brute_force_ms(sources, answer, costs):
    """Every split of the answer into steps whose drafted part (all but the last token of the
    step) occurs verbatim in a source or in the answer before the step."""
    from redwood.plan.live_costs import measured_ms

    def copyable(at, d):
        span = answer[at:at + d]
        texts = [*sources, answer[:at]]
        return d == 0 or any(t[i:i + d] == span for t in texts for i in range(len(t) - d + 1))

    best = {len(answer): 0.0}
    for at in range(len(answer) - 1, -1, -1):
        best[at] = min(measured_ms(costs, d + 1) + best[at + d + 1]
                       for d in range(min(max(costs) - 1, len(answer) - at - 1) + 1)
                       if copyable(at, d))
    return best[0]


def test_nothing_to_copy_decodes_plainly():
    assert cc.copy_oracle_ms([[1, 2, 3]], [7, 8, 9, 10], COSTS) == 400.0


def test_an_answer_found_in_a_source_is_copied_in_the_cheapest_chunks():
    answer = list(range(20, 36))                             # 16 tokens, all in the source
    assert cc.copy_oracle_ms([[5, *answer, 6]], answer, COSTS) == cc.oracle_ms(16, COSTS)


def test_a_copy_never_reads_the_part_of_the_answer_not_yet_written():
    # [1, 2] repeated: the second copy can come from the first, the first from nowhere;
    # t(2) for the last two tokens: one drafted + the bonus
    assert cc.copy_oracle_ms([], [1, 2, 1, 2], COSTS) == pytest.approx(100 + 100 + 110)


@pytest.mark.parametrize("seed", range(30))
def test_matches_a_brute_force_over_every_schedule(seed):
    rng = random.Random(seed)
    sources = [[rng.randrange(4) for _ in range(rng.randrange(0, 12))] for _ in range(2)]
    answer = [rng.randrange(4) for _ in range(rng.randrange(1, 14))]
    assert cc.copy_oracle_ms(sources, answer, COSTS) == pytest.approx(
        brute_force_ms(sources, answer, COSTS))


def test_a_memory_source_only_ever_helps():
    rng = random.Random(5)
    for _ in range(20):
        answer = [rng.randrange(5) for _ in range(12)]
        prompt = [rng.randrange(5) for _ in range(6)]
        earlier = [rng.randrange(5) for _ in range(10)]
        assert cc.copy_oracle_ms([prompt, earlier], answer, COSTS) <= \
            cc.copy_oracle_ms([prompt], answer, COSTS)


def test_the_set_summary_reports_the_memory_gain_per_prompt_and_in_total():
    rows = [{"set": "agent", "prompt": f"agent-{i}", "prompt_tokens": 100, "answer_tokens": 50,
             "plain_ms": plain, "ceiling": 2.0, "copy_ceiling_request": alone,
             "copy_ceiling_memory": mine, "ngram_policy": 1.1, "request_only_policy": 1.1,
             "policy_drafted_steps": 4, "policy_predicted_tokens": 8.0, "policy_kept_tokens": 10}
            for i, (plain, alone, mine) in enumerate([(1000.0, 1.0, 2.0), (3000.0, 1.5, 1.5)])]
    text = cc.markdown(rows)
    # per prompt 2.0 and 1.0 -> median 1.5; in total (1000 + 3000) / (500 + 2000) = 1.6 over
    # (1000 + 3000) / (1000 + 2000) = 1.333..., a gain of 1.2
    assert "copy ceiling 1.500 (1.200 in total)" in text
    assert "policy 1.000 (1.000 in total)" in text
    assert "predicted / kept tokens per drafted step 2.00 / 2.50" in text   # pooled over 8 steps
    assert "| agent | agent-0 | 100 / 50 | 2.00 | 1.00 / 2.00 | 1.10 | 1.10 |" in text


def _record(method, wall, tokens, decode_ms=None):
    extra = {"timings": {"predicted_n": tokens, "predicted_ms": decode_ms}} if decode_ms else {}
    return {"round": 1, "prompt_set": "whole_file", "prompt": "whole_file-0", "temperature": 0.6,
            "method": method, "order": 0, "prompt_tokens": 400, "wall_seconds": wall,
            "completion_tokens": tokens, "finish_reason": "stop", "ttft_seconds": None,
            "text": "x" * tokens, "load_average": 0.0, "extra": extra}


def test_a_measured_speedup_carries_the_baseline_to_the_methods_answer_length():
    base = _record("llama-server", 20.0, 200, decode_ms=16000.0)        # 80 ms a token
    assert cc.measured_speedup(base, _record("redwood", 10.0, 200)) == pytest.approx(2.0)
    # a sample 100 tokens shorter: the baseline would have taken 20 - 100 * 0.08 = 12 s for it
    assert cc.measured_speedup(base, _record("redwood", 6.0, 100)) == pytest.approx(2.0)
    assert cc.measured_speedup(base, _record("redwood", 12.0, 300)) == pytest.approx(28 / 12)


@pytest.mark.parametrize("temperature", [0.0, 0.6])
def test_the_policy_replay_drafts_with_the_keys_of_its_temperature(temperature):
    from redwood.decode.ngram_drafter import NgramDrafter

    costs = {1: 10.0, 2: 11.0, 4: 12.0, 8: 14.0, 16: 16.0, 32: 20.0}   # flat: copies pay
    text = [5, 6, 7, 8, 9, 10, 11, 12] * 6
    drafter = NgramDrafter(target_ms=costs, max_length=32)
    out = cc.policy_replay(drafter, [1, 2, 3] + text[:8], text[8:], costs, temperature)
    assert {key[0] for key in drafter.model.counts} == {temperature == 0}   # greedy keys at T 0
    assert out["steps"] > 0 and out["kept"] > 2 * out["steps"]               # the copy was drafted
    assert out["ms"] < costs[1] * len(text[8:])
