"""The plain step's in-place sampler (decode/plain_sampling.py) against the exact law, without a
model: chi-square on rows spanning several blocks, a zero-mass tail, seeded repeatability."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from redwood.decode.params import SamplingParams
from redwood.decode.plain_sampling import BLOCK, PlainSampler
from redwood.decode.sampling import process_logits
from test_verify import assert_law


def _law(row: np.ndarray, temperature: float) -> dict:
    probs = process_logits(torch.from_numpy(row.copy()), temperature).double().numpy()
    return {i: float(p) for i, p in enumerate(probs) if p > 0}


@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_draws_follow_softmax_at_temperature(temperature):
    rng = np.random.default_rng(0)
    vocab = 3 * BLOCK + 37                                   # a ragged last block
    row = rng.normal(0, 1, vocab).astype(np.float32)
    row[rng.choice(vocab, 12, replace=False)] += 6.0          # mass spread over a few blocks
    sampler, generator = PlainSampler(), torch.Generator().manual_seed(1)
    draws = 6000
    counts = Counter(sampler.sample(row, temperature, generator) for _ in range(draws))
    assert_law(counts, _law(row, temperature), draws)


def test_never_a_token_of_zero_mass_and_seeded():
    row = np.full(2 * BLOCK, -1e30, dtype=np.float32)        # exp underflows to exactly 0
    row[[5, 700]] = [0.0, 0.5]
    sampler = PlainSampler()
    first = [sampler.sample(row, 1.0, torch.Generator().manual_seed(3)) for _ in range(3)]
    draws = {sampler.sample(row, 1.0, torch.Generator().manual_seed(s)) for s in range(200)}
    assert draws == {5, 700} and len(set(first)) == 1


def test_only_plain_temperature_settings_take_this_path():
    assert PlainSampler.handles(SamplingParams(8, temperature=0.7))
    assert not PlainSampler.handles(SamplingParams(8, temperature=0.0))
    assert not PlainSampler.handles(SamplingParams(8, temperature=0.7, top_p=0.9))
    assert not PlainSampler.handles(SamplingParams(8, temperature=0.7, top_k=40))
