"""Position-keyed sampling (decode/token_sampler.py, verify.verify_walk): a position's uniforms
depend on the seed and the position alone; walking a tree of point-mass drafts with them samples
the target's law (chi-square) and gives exactly the tokens plain sampling gives with the same
seed; and so does a whole seeded generation with prompt lookup on the engine (transformers here;
llama.cpp's engine and the batch in test_batch_ngram.py)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from redwood.decode.params import SamplingParams
from redwood.decode.token_sampler import PositionUniforms, TokenSampler
from redwood.decode.verify import verify_walk
from redwood.plan.tree import Tree
from test_verify import assert_law


def test_a_positions_uniforms_depend_on_seed_and_position_alone():
    uniforms = PositionUniforms(7)
    first = uniforms.stream(5)
    a = [first() for _ in range(4)]
    uniforms.stream(9)()                               # other positions drawn in between
    again = PositionUniforms(7).stream(5)
    assert [again() for _ in range(4)] == a
    assert len(set(a)) == 4
    assert PositionUniforms(7).stream(6)() != a[0] and PositionUniforms(8).stream(5)() != a[0]


@pytest.mark.parametrize("draw", [0, 1])
def test_uniforms_are_uniform_across_positions_and_seeds(draw):
    """First and second draws of 10,000 (seed, position) pairs: ten equal bins (chi-square),
    and neighbouring positions uncorrelated."""
    values = []
    for seed in range(10):
        uniforms = PositionUniforms(seed)
        for position in range(1000):
            stream = uniforms.stream(position)
            values.append([stream() for _ in range(draw + 1)][-1])
    values = np.array(values)
    assert values.min() >= 0.0 and values.max() < 1.0
    counts = Counter(int(v * 10) for v in values)
    assert_law(counts, {b: 0.1 for b in range(10)}, len(values))
    assert abs(np.corrcoef(values[:-1], values[1:])[0, 1]) < 0.05


# A toy target over 5 tokens: its logits after a prefix depend on the prefix's last two tokens.
VOCAB = 5


def toy_row(prefix) -> np.ndarray:
    rng = np.random.default_rng(abs(hash(tuple(prefix[-2:]))) % (2**32))
    return (rng.normal(0, 1.2, VOCAB)).astype(np.float32)


def toy_law(prefix, temperature):
    weights = np.exp(toy_row(prefix).astype(np.float64) / temperature)
    return weights / weights.sum()


# root -> 0, 1; 0 -> 2 -> 3 (point-mass drafts of tokens 1, 3, 1, 4 below)
TREE = Tree([-1, 0, 0, 1, 3])
DRAFTS = [None, 1, 3, 1, 4]


def speculative_tokens(sampler, prompt, n):
    """Steps of TREE over the toy target until n tokens: each node's row is the target's after
    the node's prefix, and the walk draws each node's token at its position."""
    out = []
    while len(out) < n:
        prefixes = [list(prompt) + out]
        for node in range(1, len(TREE)):
            prefixes.append(prefixes[TREE.parents[node]] + [DRAFTS[node]])
        tokens = torch.tensor([0] + DRAFTS[1:])
        position = len(out)
        path, bonus = verify_walk(tokens, TREE, lambda node, depth: sampler.token(
            toy_row(prefixes[node]), position + depth))
        out += [DRAFTS[u] for u in path[1:]] + [bonus]
    return out[:n]


def plain_tokens(sampler, prompt, n):
    out = []
    for position in range(n):
        out.append(sampler.token(toy_row(list(prompt) + out), position))
    return out


def test_walking_point_mass_drafts_samples_the_target_and_equals_plain_sampling():
    prompt, temperature, draws = [2, 1], 0.8, 6000
    params = SamplingParams(3, temperature=temperature)
    counts, kept = Counter(), 0
    for seed in range(draws):
        sampler = TokenSampler(params, torch.Generator().manual_seed(seed))
        tokens = speculative_tokens(sampler, prompt, 3)
        plain = plain_tokens(TokenSampler(params, torch.Generator().manual_seed(seed)), prompt, 3)
        assert tokens == plain, seed
        counts[tuple(tokens)] += 1
        kept += tokens[0] in (1, 3)
    law = {}
    for a in range(VOCAB):
        for b in range(VOCAB):
            for c in range(VOCAB):
                law[(a, b, c)] = (toy_law(prompt, temperature)[a]
                                  * toy_law(prompt + [a], temperature)[b]
                                  * toy_law(prompt + [a, b], temperature)[c])
    assert_law(counts, law, draws)
    assert kept > draws * 0.2, "drafts were hardly ever kept: the test would not bite"


def test_top_p_keeps_the_generator_and_greedy_the_argmax():
    row = np.array([0.1, 2.0, 1.9, -1.0], dtype=np.float32)
    assert not TokenSampler(SamplingParams(4, temperature=0.7, top_p=0.9),
                            torch.Generator().manual_seed(0)).positional
    greedy = TokenSampler(SamplingParams(4), torch.Generator().manual_seed(0))
    assert greedy.token(row, 3) == 1 and greedy.token(torch.from_numpy(row), 3) == 1
    sampler = TokenSampler(SamplingParams(4, temperature=0.7), torch.Generator().manual_seed(3))
    assert sampler.positional
    assert sampler.token(row, 2) == sampler.token(torch.from_numpy(row), 2)   # tensor or numpy


# -- whole generations: drafted and plain give the same text with a seed ---------------------

def test_engine_seeded_text_is_the_same_drafted_or_not_transformers():
    """T = 0.05: low enough that the tiny random model's sampled text still follows the
    prompt's cycles (drafts are kept), yet sampled: every token goes through the position's
    uniforms."""
    from redwood.decode.engine import Engine
    from redwood.decode.ngram_drafter import NgramDrafter
    from test_ngram import WIDE_DEEP, repeated_prompt
    from tiny import tiny_model

    target = tiny_model("llama", vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    engine = Engine(target, None, WIDE_DEEP, drafter=NgramDrafter())
    gains = []
    for seed in range(3):
        prompt = repeated_prompt(seed, 96)
        plain = engine.generate(prompt, 40, method="autoregressive", temperature=0.05, seed=seed,
                                stop_on_eos=False)
        drafted = engine.generate(prompt, 40, method="sequoia", temperature=0.05, seed=seed,
                                  stop_on_eos=False)
        assert drafted.tokens == plain.tokens, seed
        gains.append(drafted.tokens_per_step)
    assert max(gains) > 1.5, gains                      # drafts were really kept
