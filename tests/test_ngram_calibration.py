"""Per-source calibration of the n-gram drafter (measure/ngram_calibration.py): the replay sees
what speculative steps with the whole trie see, calibrated priors replace the guesses, the file
round-trips, and `calibrate --drafter ngram` / `tune --drafter hybrid` write and use it."""
from __future__ import annotations

import json

import pytest
import torch

from redwood.cli.main import main
from redwood.decode.engine import Engine
from redwood.decode.ngram_acceptance import AcceptanceModel
from redwood.decode.ngram_drafter import NgramDrafter
from redwood.decode.ngram_trees import ngram_budget_tree
from redwood.errors import RedwoodError
from redwood.measure.ngram_calibration import (NgramCalibration, acceptance_model, calibrate_ngram,
                                               replay)
from test_ngram import repeated_prompt
from tiny import tiny_model


def test_replay_observes_what_a_greedy_speculative_run_learns():
    """A greedy run proposing the whole trie (flat costs, budget larger than any trie here)
    accepts exactly the trie path the text follows: its learned counts equal the replay's.
    (Runs whose last step was cut at max_new_tokens are skipped: their bonus is unknown.)"""
    target = tiny_model("qwen2", vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    compared = 0
    for seed in range(3):
        prompt = repeated_prompt(seed, 96)
        for max_new in range(24, 36):
            drafter = NgramDrafter(target_ms=None, max_continuations=3)
            engine = Engine(target, None, ngram_budget_tree(), drafter=drafter)
            result = engine.generate(prompt, max_new, stop_on_eos=False)
            if len(drafter.index.tokens) != len(prompt) + max_new - 1:
                continue                                    # the last step was cut
            drafter.skip(result.tokens[-1])                 # the bonus: learn from the last trie
            replayed = replay(prompt.tolist(), result.tokens, True,
                              NgramDrafter(target_ms=None, max_continuations=3))
            assert replayed.counts == drafter.model.counts, (seed, max_new)
            assert sum(trials for _, trials in replayed.counts.values()) > 5
            compared += 1
    assert compared >= 3


def test_calibrated_priors_replace_the_guesses_where_measured():
    key, rare = (True, 0, 0, False), (True, 3, 0, False)
    model = AcceptanceModel(calibration={key: [2.0, 20.0], rare: [1.0, 2.0]})
    assert model.prior(key) == pytest.approx(0.1)
    assert model.prior(rare) == AcceptanceModel().prior(rare)          # too few observations
    assert model.rate(key) == pytest.approx(0.1)


def test_calibration_on_a_model_and_round_trip(tmp_path):
    target = tiny_model("qwen2", vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    prompts = [repeated_prompt(s, 96) for s in range(2)]
    greedy = calibrate_ngram(target, prompts, 0.0, 24, progress=False, dataset="t")
    sampled = calibrate_ngram(target, prompts, 1.0, 24, progress=False, dataset="t")
    assert {k[0] for k in greedy.counts} == {True} and {k[0] for k in sampled.counts} == {False}
    merged = greedy.merged(sampled)
    merged.save(tmp_path / "n.json")
    loaded = NgramCalibration.load(tmp_path / "n.json")
    assert loaded.counts == merged.counts and loaded.temperatures == [0.0, 1.0]
    assert all(0 <= a <= t for a, t in loaded.counts.values())
    (tmp_path / "bad.json").write_text('{"kind": "ngram_acceptance", "format": 1, '
                                       '"counts": [[[true, 0, 0, false], [5, 2]]]}')
    with pytest.raises(RedwoodError, match="cannot read n-gram acceptance"):
        NgramCalibration.load(tmp_path / "bad.json")


def test_format_1_files_load_with_their_4_plus_bucket_as_every_longer_buckets_prior(tmp_path):
    """Format 1 bucketed matches 1, 2, 3, 4+; format 2 splits 4+ into 4-7, 8-15, 16-31, 32+."""
    (tmp_path / "old.json").write_text(json.dumps({
        "kind": "ngram_acceptance", "format": 1, "temperatures": [0.0],
        "counts": [[[True, 0, 1, False], [3, 10]], [[True, 3, 5, False], [90, 100]]]}))
    counts = NgramCalibration.load(tmp_path / "old.json").counts
    assert counts[(True, 0, 1, False)] == [3.0, 10.0]
    assert {k for k in counts if k[1] >= 3} == {(True, b, 5, False) for b in range(3, 7)}
    assert all(counts[(True, b, 5, False)] == [90.0, 100.0] for b in range(3, 7))
    assert NgramCalibration(counts).to_dict()["format"] == 2          # saved as format 2


def test_cli_calibrate_ngram_quick(tmp_path, capsys):
    out = tmp_path / "ngram.json"
    assert main(["calibrate", "--quick", "--drafter", "ngram", "--temperature", "0",
                 "--num-prompts", "2", "--max-new-tokens", "16", "--out", str(out)]) == 0
    assert "rank-1 acceptance" in capsys.readouterr().out
    assert NgramCalibration.load(out).extra["prompts"] == 2


def test_cli_calibrate_refuses_hybrid_and_edits_for_the_model(tmp_path, capsys):
    assert main(["calibrate", "--quick", "--drafter", "hybrid", "--out",
                 str(tmp_path / "a.json")]) == 2
    assert "--drafter ngram" in capsys.readouterr().err
    assert main(["calibrate", "--quick", "--prompts", "edits", "--out",
                 str(tmp_path / "a.json")]) == 2
    assert "add --drafter ngram" in capsys.readouterr().err


def test_cli_tune_hybrid_records_the_ngram_calibration(tmp_path, capsys):
    from redwood.measure.bundles import load_bundle

    out = tmp_path / "bundle"
    assert main(["tune", "--quick", "--drafter", "hybrid", "--out", str(out), "--temperatures",
                 "0,1", "--max-budget", "6", "--max-depth", "4", "--num-prompts", "2",
                 "--max-new-tokens", "12"]) == 0
    bundle = load_bundle(out)
    assert bundle.ngram_acceptance == out / "ngram-acceptance.json"
    assert json.loads((out / "bundle.json").read_text())["ngram_acceptance"]
    calibration = NgramCalibration.load(bundle.ngram_acceptance)
    assert calibration.temperatures == [0.0, 1.0]
    model = acceptance_model(bundle)
    assert model.calibrated == {k: a / t for k, (a, t) in calibration.counts.items()
                                if t >= AcceptanceModel.CALIBRATED_MIN}


def test_cli_calibrate_ngram_adds_its_counts_to_a_bundle(tmp_path, capsys):
    """--add-to: the bundle's n-gram priors become the sum of its old counts and the run's,
    both datasets and commands kept, and the bundle index points at the file."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "bundle.json").write_text(json.dumps({"kind": "bundle"}))
    old = NgramCalibration({(True, 0, 0, False): [3.0, 10.0]}, [0.0],
                           {"dataset": "old text", "command": "old run", "prompts": 5,
                            "tokens": 100})
    old.save(bundle / "ngram-acceptance.json")
    out = tmp_path / "run.json"
    assert main(["calibrate", "--quick", "--drafter", "ngram", "--temperature", "0",
                 "--num-prompts", "2", "--max-new-tokens", "16", "--out", str(out),
                 "--add-to", str(bundle)]) == 0
    run = NgramCalibration.load(out)
    merged = NgramCalibration.load(bundle / "ngram-acceptance.json")
    keys = set(run.counts) | {(True, 0, 0, False)}
    assert set(merged.counts) == keys
    for key in keys:
        want = [a + b for a, b in zip(run.counts.get(key, [0.0, 0.0]),
                                      old.counts.get(key, [0.0, 0.0]))]
        assert merged.counts[key] == want
    assert merged.extra["dataset"].startswith("old text; ")
    assert merged.extra["command"].startswith("old run; redwood calibrate")
    assert "--add-to" in merged.extra["command"]
    assert merged.extra["prompts"] == 7 and merged.extra["tokens"] == 100 + run.extra["tokens"]
    assert json.loads((bundle / "bundle.json").read_text())["ngram_acceptance"] == \
        "ngram-acceptance.json"


def test_cli_calibrate_add_to_is_checked_before_decoding(tmp_path, capsys):
    assert main(["calibrate", "--quick", "--drafter", "ngram", "--out", str(tmp_path / "a.json"),
                 "--add-to", str(tmp_path)]) == 2
    assert "not a bundle directory" in capsys.readouterr().err
    assert main(["calibrate", "--quick", "--out", str(tmp_path / "a.json"),
                 "--add-to", str(tmp_path)]) == 2
    assert "add --drafter ngram" in capsys.readouterr().err
    assert not (tmp_path / "a.json").exists()
