"""benchmarks/calibration_replay.py: the per-key calibration replay counts what verification
would try and keep (pure python drafter; no model)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "calibration_replay.py"
SPEC = importlib.util.spec_from_file_location("calibration_replay_script", PATH)
cr = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(cr)

FLAT = {1: 10.0, 2: 11.0, 4: 12.0, 8: 14.0, 16: 16.0, 32: 20.0}     # copies pay


def _drafter():
    from redwood.decode.ngram_drafter import NgramDrafter
    return NgramDrafter(target_ms=FLAT, max_length=32)


@pytest.mark.parametrize("temperature", [0.0, 0.6])
def test_a_repeated_text_is_drafted_and_every_kept_token_is_a_tried_node(temperature):
    text = [5, 6, 7, 8, 9, 10, 11, 12] * 6
    tally = cr.Tally()
    cr.replay(_drafter(), [1, 2, 3] + text[:8], text[8:], temperature, tally.for_prompt("p"))
    nodes, steps = tally.total("nodes"), tally.total("steps")
    kept_nodes = sum(row[1] for row in nodes.values())
    drafted, kept_tokens = sum(r[2] for r in steps.values()), sum(r[1] for r in steps.values())
    assert drafted > 0 and kept_nodes > 2 * drafted
    # every drafted step keeps its kept nodes plus the bonus token
    assert kept_tokens == kept_nodes + drafted
    # the tokens decoded: drafted steps' kept tokens plus one per plain step, the whole answer
    assert kept_tokens <= len(text) - 8
    assert all(0 <= rates <= tried and kept <= tried for rates, kept, tried in nodes.values())


def test_a_wrong_copy_counts_tried_nodes_that_were_not_kept():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 4]
    answer = [5, 6, 40, 41, 42, 43, 44, 45]       # follows the copy for 2 tokens, then leaves
    tally = cr.Tally()
    cr.replay(_drafter(), prompt, answer, 0.0, tally.for_prompt("p"))
    nodes = tally.total("nodes")
    tried, kept = sum(r[2] for r in nodes.values()), sum(r[1] for r in nodes.values())
    assert tried > kept >= 1                       # the node after 6 (7) was tried, not kept
    assert tally.bias() > 0                         # the chain predicted more than it kept


def test_nothing_to_copy_drafts_nothing():
    tally = cr.Tally()
    cr.replay(_drafter(), [1, 2, 3], list(range(20, 60)), 0.6, tally.for_prompt("p"))
    assert not tally.total("steps") and tally.bias() is None
    report = tally.report("chat", 0.6, answers=1, resamples=10)
    assert report["bias_95"] is None and "0 drafted steps" in cr.markdown(report)


def test_the_report_bootstraps_over_prompts():
    tally = cr.Tally()
    for name, (predicted, kept) in {"a": (30.0, 20), "b": (10.0, 10)}.items():
        tally.for_prompt(name)["steps"]["near"] = [predicted, kept, 5]
    report = tally.report("chat", 0.6, answers=2, resamples=200)
    assert report["bias"] == pytest.approx(40 / 30 - 1)
    low, high = report["bias_95"]
    assert 0.0 <= low <= report["bias"] <= high <= 0.5
    assert report["by_prompt"]["b"]["bias"] == pytest.approx(0.0)
    assert "near" in cr.markdown(report)


def test_key_labels_name_bucket_depth_and_sibling():
    from redwood.decode.ngram_acceptance import MATCH_LABELS
    assert cr.key_label((False, 4, 0, False), MATCH_LABELS) == "8-15 d1"
    assert cr.key_label((True, 7, 1, True), MATCH_LABELS) == "near d2 r2+"


@pytest.mark.parametrize("text, expected", [(None, (0, None)), ("12:24", (12, 24))])
def test_a_prompt_range_is_read(text, expected):
    assert cr._prompt_range(None, text) == expected


@pytest.mark.parametrize("text", ["12", "a:b", "5:5", "-1:3"])
def test_a_bad_prompt_range_is_refused(text):
    import argparse

    with pytest.raises(SystemExit):
        cr._prompt_range(argparse.ArgumentParser(), text)


def test_prompt_index_is_the_number_after_the_last_dash():
    assert cr.prompt_index("chat-7") == 7 and cr.prompt_index("edit-whole-12") == 12
