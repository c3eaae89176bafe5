"""Acceptance vectors and latency profiles: round trips, validation messages, conversions."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redwood.errors import RedwoodError
from redwood.plan.formats import (Acceptance, Profile, conditional_to_unconditional, load_acceptance,
                             load_profile, sample_acceptance_path, sample_profile_path,
                             save_acceptance, save_profile, unconditional_to_conditional,
                             validate_p)


def _write(tmp_path, payload, name="x.json"):
    path = tmp_path / name
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return path


def test_acceptance_round_trip(tmp_path):
    acc = Acceptance(p=[0.8, 0.1, 0.05], temperature=0.7, top_p=0.9, top_k=None,
                     draft="d", target="t", dataset="humaneval[0:20]", steps=400,
                     extra={"source": "unit test"})
    path = save_acceptance(acc, tmp_path / "a.json")
    data = json.loads(path.read_text())
    assert data["format"] == 1 and data["kind"] == "acceptance" and data["p"] == [0.8, 0.1, 0.05]
    back = load_acceptance(path)
    np.testing.assert_array_equal(back.p, acc.p)
    assert (back.temperature, back.top_p, back.top_k, back.steps) == (0.7, 0.9, None, 400)
    assert back.extra == {"source": "unit test"} and back.dataset == "humaneval[0:20]"


def test_profile_round_trip(tmp_path):
    prof = Profile(target_ms={1: 312, 8: 573.5}, draft_ms={"1": 128, "4": 140},
                   device="cpu", dtype="float32", context=256)
    assert prof.draft_ms == {1: 128.0, 4: 140.0}           # string keys become ints
    path = save_profile(prof, tmp_path / "p.json")
    data = json.loads(path.read_text())
    assert data["target_ms"] == {"1": 312.0, "8": 573.5} and data["kind"] == "profile"
    back = load_profile(path)
    assert back.target_ms == prof.target_ms and back.draft_ms == prof.draft_ms
    assert (back.device, back.dtype, back.context) == ("cpu", "float32", 256)


def test_draft_level_ms_rule():
    prof = Profile(target_ms={1: 1}, draft_ms={1: 10, 4: 20, 16: 50})
    assert [prof.draft_level_ms(w) for w in (1, 2, 4, 5, 16, 17)] == [10, 20, 20, 50, 50, None]


@pytest.mark.parametrize("p,message", [
    ([], "empty"),
    ([0.5, -0.01], "p_2 = -0.01 is negative"),
    ([0.7, 0.3 + 1e-3], "sum\\(p\\) = 1.001000 > 1"),
    ([0.5, "x"], "expected a number"),
    ([0.5, None], "expected a number"),
    ([0.5, float("nan")], "non-finite"),
    ("0.5", "list of numbers"),
    ([[0.5], [0.2]], "expected a number"),
    ([True], "expected a number"),
])
def test_bad_acceptance_vectors(p, message):
    with pytest.raises(RedwoodError, match=message):
        validate_p(p)


def test_sum_tolerance():
    validate_p([0.6, 0.4 + 5e-7])                           # within 1e-6 of 1: accepted
    with pytest.raises(RedwoodError, match="sum"):
        validate_p([0.6, 0.4 + 5e-6])


@pytest.mark.parametrize("payload,message", [
    ({"format": 1, "kind": "acceptance"}, "missing 'p'"),
    ({"format": 1, "kind": "acceptance", "p": []}, "empty"),
    ({"format": 1, "kind": "acceptance", "p": [0.9, 0.2]}, "sum"),
    ({"format": 1, "kind": "acceptance", "p": [-0.1]}, "negative"),
    ({"format": 1, "kind": "profile", "p": [0.5]}, "expected 'acceptance'"),
    ({"format": 3, "kind": "acceptance", "p": [0.5]}, "format 3 is not supported"),
    ("[0.5", "not valid JSON"),
    ([0.5], "expected a JSON object"),
])
def test_bad_acceptance_files(tmp_path, payload, message):
    path = _write(tmp_path, payload)
    with pytest.raises(RedwoodError, match=message) as info:
        load_acceptance(path)
    assert str(path) in str(info.value)


def test_missing_files(tmp_path):
    with pytest.raises(RedwoodError, match="acceptance file not found"):
        load_acceptance(tmp_path / "nope.json")
    with pytest.raises(RedwoodError, match="profile file not found"):
        load_profile(tmp_path / "nope.json")


GOOD = {"1": 10.0, "2": 12.0}


@pytest.mark.parametrize("target,draft,message", [
    ({"2": 5.0}, GOOD, "target_ms has no entry for size 1"),
    (GOOD, {"4": 5.0}, "draft_ms has no entry for size 1"),
    ({"1": 0.0}, GOOD, "target_ms\\[1\\] = 0.0; times must be positive"),
    (GOOD, {"1": -3}, "draft_ms\\[1\\] = -3; times must be positive"),
    ({"1": "fast"}, GOOD, "times must be positive"),
    ({"1": float("inf")}, GOOD, "times must be positive"),
    ({"1": 5.0, "x": 3.0}, GOOD, "key 'x' is not a positive integer"),
    ({"1": 5.0, "0": 3.0}, GOOD, "key '0' is not a positive integer"),
    ({"1": 5.0, "2.5": 3.0}, GOOD, "key '2.5' is not a positive integer"),
    ({}, GOOD, "'target_ms' must be a non-empty object"),
    ([5.0], GOOD, "'target_ms' must be a non-empty object"),
])
def test_bad_profiles(tmp_path, target, draft, message):
    path = _write(tmp_path, {"format": 1, "kind": "profile", "target_ms": target, "draft_ms": draft})
    with pytest.raises(RedwoodError, match=message):
        load_profile(path)


def test_profile_missing_sections(tmp_path):
    path = _write(tmp_path, {"format": 1, "kind": "profile", "target_ms": GOOD})
    with pytest.raises(RedwoodError, match="missing 'draft_ms'"):
        load_profile(path)


def test_conditional_to_unconditional_example():
    c = [0.5, 0.5, 1.0]
    np.testing.assert_allclose(conditional_to_unconditional(c), [0.5, 0.25, 0.25])
    with pytest.raises(RedwoodError, match="\\[0, 1\\]"):
        conditional_to_unconditional([0.5, 1.2])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=8))
def test_conditional_round_trip(c):
    p = conditional_to_unconditional(c)
    validate_p(p)                                            # always a valid unconditional vector
    assert p.sum() <= 1 + 1e-9
    back = conditional_to_unconditional(unconditional_to_conditional(p))
    np.testing.assert_allclose(back, p, atol=1e-9)


def test_shipped_samples_are_valid_and_labelled():
    acc = Acceptance.load(sample_acceptance_path())
    prof = Profile.load(sample_profile_path())
    assert acc.p[0] > 0.85 and acc.p.sum() <= 1
    assert "sample" in acc.dataset and "sample" in acc.extra["source"]
    assert "sample" in prof.extra["source"]
    assert prof.target_ms[1] == 312 and 1 in prof.draft_ms
