"""The plain step's in-place sampler (decode/plain_sampling.py) against the exact law, without a
model: chi-square on a spread-out row, on rows whose envelope tail is drawn and rejected often
(small gaps), a zero-mass tail, non-finite rows, seeded repeatability; each on the numpy path and
on the native call (decode/native_sampling.py), which must also draw the numpy path's tokens."""
from __future__ import annotations

import os
import random
import shutil
from collections import Counter

import numpy as np
import pytest
import torch

from redwood.decode.params import SamplingParams
from redwood.decode import native_sampling, plain_sampling
from redwood.decode.plain_sampling import PlainSampler
from redwood.decode.sampling import process_logits
from redwood.errors import RedwoodError
from test_verify import assert_law


HAS_CC = shutil.which(os.environ.get("CC") or "cc") is not None
PATHS = [pytest.param(False, id="numpy"),
         pytest.param(True, id="native", marks=pytest.mark.skipif(not HAS_CC, reason="no cc"))]


@pytest.fixture(params=PATHS)
def native(request):
    """Each test on both paths; the native one must really be the C call."""
    if request.param:
        assert native_sampling.native_head() is not None, "the C sampler did not build"
    return request.param


def _law(row: np.ndarray, temperature: float) -> dict:
    probs = process_logits(torch.from_numpy(row.copy()), temperature).double().numpy()
    return {i: float(p) for i, p in enumerate(probs) if p > 0}


def _spread_row(vocab: int = 1573, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    row = rng.normal(0, 1, vocab).astype(np.float32)
    row[rng.choice(vocab, 12, replace=False)] += 6.0          # mass on a few tokens
    return row


@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_draws_follow_softmax_at_temperature(temperature, native):
    row = _spread_row()
    sampler, uniform = PlainSampler(native=native), random.Random(1).random
    draws = 6000
    counts = Counter(sampler.sample(row, temperature, uniform) for _ in range(draws))
    assert_law(counts, _law(row, temperature), draws)


@pytest.mark.parametrize("gap, temperature", [(1.0, 1.0), (2.5, 0.6)])
def test_the_envelope_tail_is_exact_when_drawn_often(gap, temperature, native):
    """With a small gap most tokens are in the tail, whose envelope b = e^-gap exceeds their
    weights: draws go through the tail's accept/reject branch, and the law stays exact."""
    row = np.random.default_rng(4).normal(0, 1, 60).astype(np.float32)
    law = _law(row, temperature)
    floor = float(row.max()) - gap * temperature
    tail_share = sum(p for i, p in law.items() if row[i] < floor)
    assert tail_share > 0.1, "the test must draw tail tokens"
    sampler, uniform = PlainSampler(tail_gap=gap, native=native), random.Random(2).random
    draws = 8000
    counts = Counter(sampler.sample(row, temperature, uniform) for _ in range(draws))
    assert_law(counts, law, draws)


@pytest.mark.parametrize("small_head", [0, 10**6])
def test_python_and_numpy_head_weights_are_the_same_law(monkeypatch, small_head):
    """Heads up to SMALL_HEAD tokens are weighed in Python (a list), larger ones in numpy: the
    same cumulative weights, and draws exact either way. One sampler serves rows of several
    sizes (its reused mask follows the row's)."""
    monkeypatch.setattr(plain_sampling, "SMALL_HEAD", small_head)
    row, temperature = _spread_row(), 0.6
    top = float(row.max())
    head = row[row >= top - plain_sampling.TAIL_GAP * temperature]
    cdf = plain_sampling._head_cdf(head, top, temperature)
    assert isinstance(cdf, list) == (small_head > 0)
    expected = np.cumsum(np.exp((head.astype(np.float64) - top) / temperature))
    np.testing.assert_allclose(np.asarray(cdf), expected, rtol=1e-5)
    sampler, uniform = PlainSampler(), random.Random(5).random
    short = np.random.default_rng(6).normal(0, 1, 50).astype(np.float32)
    draws = 6000
    counts, short_counts = Counter(), Counter()
    for _ in range(draws):
        counts[sampler.sample(row, temperature, uniform)] += 1
        short_counts[sampler.sample(short, 1.0, uniform)] += 1
    assert_law(counts, _law(row, temperature), draws)
    assert_law(short_counts, _law(short, 1.0), draws)


@pytest.mark.parametrize("masked", [-1e30, -np.inf])
def test_never_a_token_of_zero_mass_and_seeded(masked, native):
    row = np.full(1024, masked, dtype=np.float32)            # exp underflows to exactly 0
    row[[5, 700]] = [0.0, 0.5]
    for gap in (30.0, 0.1):                                  # 0.1: the tail is drawn, never kept
        sampler = PlainSampler(tail_gap=gap, native=native)
        first = [sampler.sample(row, 1.0, random.Random(3).random) for _ in range(3)]
        draws = {sampler.sample(row, 1.0, random.Random(s).random) for s in range(200)}
        assert draws == {5, 700} and len(set(first)) == 1


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("at", [3, 40])                     # in the C call's SIMD part or tail
def test_non_finite_logits_are_refused(bad, at, native):
    row = np.zeros(45, dtype=np.float32)
    row[at] = bad
    with pytest.raises(RedwoodError, match="not finite"):
        PlainSampler(native=native).sample(row, 0.7, random.Random(0).random)
    with pytest.raises(RedwoodError, match="not finite"):            # every logit -inf
        PlainSampler(native=native).sample(np.full(45, -np.inf, dtype=np.float32), 0.7,
                                           random.Random(0).random)


@pytest.mark.skipif(not HAS_CC, reason="no cc")
@pytest.mark.parametrize("gap", [plain_sampling.TAIL_GAP, 1.5])
def test_the_native_call_draws_the_numpy_paths_tokens(gap):
    """Same head, same uniforms in the same order, same rule: token for token, on heads
    weighed in double precision by both (up to SMALL_HEAD tokens), tail draws included (gap
    1.5). A row that is not float32 and contiguous takes the numpy path."""
    rng = np.random.default_rng(11)
    native, numpy_path = PlainSampler(tail_gap=gap), PlainSampler(tail_gap=gap, native=False)
    drawn = []
    for step in range(400):
        row = rng.normal(0, 3, 3001).astype(np.float32)
        row[rng.integers(3001, size=5)] += 12.0
        temperature = [0.3, 0.6, 1.0][step % 3]
        if np.sum(row >= row.max() - gap * temperature) > plain_sampling.SMALL_HEAD:
            continue
        seed = 77 + step
        drawn.append(native.sample(row, temperature, random.Random(seed).random))
        assert drawn[-1] == numpy_path.sample(row, temperature, random.Random(seed).random)
    assert native._native and len(drawn) > 150 and len(set(drawn)) > 50
    strided = np.repeat(_spread_row(), 2)[::2]
    assert native._native_for(strided) is None
    assert native._native_for(strided.astype(np.float64).copy()) is None


def test_the_native_helper_is_optional(tmp_path, monkeypatch):
    """No compiler: build() says so and the sampler keeps numpy; REDWOOD_NATIVE=0 turns the
    helper off; a build is cached by a name that digests the source."""
    monkeypatch.setenv("CC", "no-such-compiler-here")
    with pytest.raises(RuntimeError, match="no C compiler"):
        native_sampling.build(tmp_path)
    native_sampling._library_function.cache_clear()
    try:
        assert native_sampling.native_head() is None
        row = _spread_row()
        assert PlainSampler().sample(row, 0.6, random.Random(0).random) in range(len(row))
        monkeypatch.delenv("CC")
        monkeypatch.setenv("REDWOOD_NATIVE", "0")
        native_sampling._library_function.cache_clear()
        assert native_sampling.native_head() is None
        if HAS_CC:
            first = native_sampling.build(tmp_path)
            assert native_sampling.build(tmp_path) == first and first.stat().st_size > 0
    finally:
        native_sampling._library_function.cache_clear()


def test_only_plain_temperature_settings_take_this_path():
    assert PlainSampler.handles(SamplingParams(8, temperature=0.7))
    assert not PlainSampler.handles(SamplingParams(8, temperature=0.0))
    assert not PlainSampler.handles(SamplingParams(8, temperature=0.7, top_p=0.9))
    assert not PlainSampler.handles(SamplingParams(8, temperature=0.7, top_k=40))
    with pytest.raises(ValueError):
        PlainSampler(tail_gap=0)
