"""Learnt n-gram acceptance rates kept between processes (measure/learned_rates.py)."""
from __future__ import annotations

import json

import pytest
from redwood.decode.ngram_acceptance import AcceptanceModel
from redwood.decode.ngram_drafter import NgramDrafter
from redwood.measure.learned_rates import (MAX_TRIALS, learned_rates_path, load_learned,
                                           save_learned, with_learned_rates)
from redwood.measure.ngram_calibration import acceptance_model

KEY = (True, 7, 0, False)             # greedy, "near", depth 1, rank 1


@pytest.fixture
def learning(tmp_path, monkeypatch):
    """Learnt rates on, in a cache of the test's own."""
    monkeypatch.setenv("REDWOOD_CACHE", str(tmp_path))
    monkeypatch.setenv("REDWOOD_LEARNED_RATES", "1")
    return tmp_path


def taught(accepted: int, trials: int) -> AcceptanceModel:
    model = AcceptanceModel()
    for i in range(trials):
        model.observe(KEY, i < accepted)
    model.observe_draft(True, 3.0, 2)
    return model


def test_saved_rates_load_into_a_fresh_model(tmp_path):
    path = tmp_path / "rates.json"
    model = taught(30, 40)
    save_learned(model, path)
    fresh = AcceptanceModel()
    assert fresh.rate(KEY) != pytest.approx(model.rate(KEY))
    assert load_learned(fresh, path)
    assert fresh.rate(KEY) == pytest.approx(model.rate(KEY))
    assert fresh.draft_ratio(True, 3.0) == pytest.approx(model.draft_ratio(True, 3.0))


def test_old_evidence_is_scaled_down_so_the_rates_stay_adaptive(tmp_path):
    path = tmp_path / "rates.json"
    model = taught(900, 1000)
    save_learned(model, path)
    fresh = AcceptanceModel()
    load_learned(fresh, path)
    accepted, trials = fresh.counts[KEY]
    assert trials == pytest.approx(MAX_TRIALS) and accepted / trials == pytest.approx(0.9)
    for _ in range(int(MAX_TRIALS)):               # a new workload where the key never holds
        fresh.observe(KEY, False)
    assert fresh.rate(KEY) < 0.5


@pytest.mark.parametrize("text", ["{not json", '{"format": 2, "counts": {"1,2": [1, 2]}, '
                                  '"drafts": {}}', '{"format": 2, "counts": {"1,7,0,0": '
                                  '[-1, 2]}, "drafts": {}}', '{"format": 2, "counts": {}, '
                                  '"drafts": {}, "kinds": {"5": {"counts": {}, "drafts": {}}}}'])
def test_a_damaged_file_is_reported_and_ignored(tmp_path, capsys, text):
    path = tmp_path / "rates.json"
    path.write_text(text)
    model = AcceptanceModel()
    assert not load_learned(model, path)
    assert model.counts == {} and "damaged" in capsys.readouterr().err


def test_off_when_the_environment_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("REDWOOD_CACHE", str(tmp_path))
    monkeypatch.setenv("REDWOOD_LEARNED_RATES", "0")
    assert learned_rates_path() is None
    model = with_learned_rates(taught(3, 4))
    model.request_done()
    assert model.persist is None and not list(tmp_path.rglob("*.json"))


def test_the_priors_name_the_file(tmp_path, learning):
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"a": 1}))
    assert learned_rates_path(calibration) != learned_rates_path(None)
    assert learned_rates_path(None).parent == learning / "acceptance"


def copy_request(model: AcceptanceModel, text: list[int]) -> None:
    """One greedy request whose answer is `text` (a repeated run), drafted by an NgramDrafter
    on `model`, each step keeping the proposed chain as far as the text follows it."""
    from test_ngram_shadow import copy_steps

    half = len(text) // 2
    copy_steps(NgramDrafter(model=model), text[:half], text[half:])


def test_a_finished_request_teaches_the_next_process(learning):
    text = list(range(100, 140)) * 3
    first = acceptance_model(None, learned=True)
    copy_request(first, text)
    short = first.kind_pool(0)                           # a 60-token prompt
    assert short.counts, "the request observed nothing to keep"
    files = list((learning / "acceptance").glob("rates-*.json"))
    assert len(files) == 1
    second = acceptance_model(None, learned=True)        # a later process, same priors
    assert second.kind_pool(0).counts == short.counts
    assert second.kind_pool(0).drafts == short.drafts
    assert acceptance_model(None).kind_pool(0).counts == {}   # not asked to: the priors alone


def test_an_unwritable_cache_does_not_fail_the_request(learning, capsys, monkeypatch):
    """The cache path runs through a plain file, so the save fails even for root: the request
    finishes, the failure is said once and saving stops."""
    blocker = learning / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("REDWOOD_CACHE", str(blocker / "cache"))
    model = acceptance_model(None, learned=True)
    copy_request(model, list(range(100, 140)) * 3)
    assert model.persist is None and model.kind_pool(0).counts
    assert capsys.readouterr().err.count("cannot save learnt n-gram rates") == 1
