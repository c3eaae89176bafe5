"""The one-sequence prompt cache (LlamaCppBackend.keep_prefix, Engine(prompt_cache=...)): a new
prompt reuses the KV of the longest prefix it shares with what the backends hold, as a
llama-server slot does. Tiny GGUF models: the kept prefix gives the logits of a fresh prefill
(within the batch-shape tolerance), the backend's token record matches its cache, multi-turn
generations are the same with the cache on and off (plain and speculative), and a request can
opt out."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

pytest.importorskip("llama_cpp")

from redwood.backends.llamacpp import LlamaCppBackend  # noqa: E402
from redwood.decode.engine import Engine  # noqa: E402
from redwood.plan.tree import Tree  # noqa: E402
from test_llamacpp_backend import assert_matches  # noqa: E402
from test_verify import assert_law  # noqa: E402
from tiny_gguf import tiny_gguf_pair, write_perturbed_gguf  # noqa: E402,F401

TURN1 = [240, 58, 20, 146, 72, 66]            # clear greedy margins (test_engine_llamacpp)
FOLLOW_UP = [257, 108, 134, 109]              # the "user's" next message
TREE = Tree([-1, 0, 0, 1, 2])


def backend_for(path) -> LlamaCppBackend:
    return LlamaCppBackend(path, n_ctx=512, n_seq_max=16, n_batch=64, n_threads=1)


@pytest.fixture(scope="module")
def paths(tiny_gguf_pair, tmp_path_factory):
    draft = write_perturbed_gguf(tmp_path_factory.mktemp("cache") / "noisy.gguf", 0, 0.1)
    return tiny_gguf_pair[0], draft


@pytest.fixture(scope="module")
def backends(paths):
    made = [backend_for(p) for p in paths]
    yield made
    for b in made:
        b.close()


def test_keep_prefix_keeps_what_a_fresh_prefill_computes(backends, paths):
    target = backends[0]
    target.reset()
    target.append(TURN1 + [11, 12, 13], rows=0)
    assert target.keep_prefix(TURN1 + [99, 98]) == len(TURN1)        # diverges after TURN1
    assert target.cache_length() == len(TURN1)
    reused = target.append([99, 98], rows=1)
    with backend_for(paths[0]) as fresh:
        assert_matches(reused, fresh.append(TURN1 + [99, 98], rows=1))
    assert target.keep_prefix(TURN1, most=3) == 3                    # capped by `most`
    assert target.keep_prefix([7, 7]) == 0 and target.cache_length() == 0


def test_token_record_follows_trees_and_plain_steps(backends):
    """After a speculative generation the backend's record is what its cache holds."""
    engine = Engine(*backends, TREE)
    result = engine.generate(torch.tensor(TURN1), 20, stop_on_eos=False)
    target = backends[0]
    text = TURN1 + result.tokens
    assert target._tokens == text[:target.cache_length()]
    assert target.cache_length() >= len(text) - 2      # all but the newest token(s)


@pytest.mark.parametrize("method", ["autoregressive", "sequoia"])
def test_multi_turn_same_tokens_with_and_without_the_cache(backends, method):
    engine = Engine(*backends, TREE, live_costs=False)
    first = engine.generate(torch.tensor(TURN1), 16, method=method, stop_on_eos=False)
    turn2 = torch.tensor(TURN1 + first.tokens + FOLLOW_UP)
    cached = engine.generate(turn2, 16, method=method, stop_on_eos=False)
    assert cached.stats.cached_prompt_tokens >= len(TURN1) + len(first.tokens) - 2
    fresh = engine.generate(turn2, 16, method=method, stop_on_eos=False, cache_prompt=False)
    assert fresh.stats.cached_prompt_tokens == 0
    assert cached.tokens == fresh.tokens
    again = engine.generate(turn2, 16, method=method, stop_on_eos=False)   # the same prompt
    assert again.stats.cached_prompt_tokens == len(turn2) - 1 and again.tokens == fresh.tokens


def test_engine_default_off(backends):
    engine = Engine(*backends, TREE, prompt_cache=False)
    engine.generate(torch.tensor(TURN1), 4, stop_on_eos=False)
    assert engine.generate(torch.tensor(TURN1), 4, stop_on_eos=False).stats.cached_prompt_tokens == 0


@pytest.mark.slow
def test_sampling_after_reuse_follows_the_target(backends, paths):
    """Chi-square: the token after a cached prefix (plain path, T = 1) follows the law of a
    fresh prefill of the whole prompt."""
    from redwood.decode.sampling import process_logits

    prompt = TURN1 + FOLLOW_UP
    with backend_for(paths[0]) as fresh:
        law = process_logits(fresh.append(prompt, rows=1)[0], 1.0).double()
    engine = Engine(*backends, TREE)
    counts, draws = Counter(), 1500
    for seed in range(draws):
        result = engine.generate(torch.tensor(prompt), 1, temperature=1.0, seed=seed,
                                 method="autoregressive", stop_on_eos=False)
        assert seed == 0 or result.stats.cached_prompt_tokens == len(prompt) - 1
        counts[result.tokens[0]] += 1
    assert_law(counts, {i: float(p) for i, p in enumerate(law) if p > 0}, draws)
