"""The fused first verification (docs/design.md §5.4): `Backend.prefill_tree` runs the prompt
and the first drafted tree in one target forward. It must give the logits and the cache of the
two-call route (append(ids, rows=0) then run_tree), and the engine's output must not move:
greedy equals plain greedy, sampling follows the target's law."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from redwood.backends.hf import HFBackend
from redwood.decode.engine import Engine
from redwood.errors import RedwoodError
from redwood.plan.tree import Tree
from tiny import tiny_model
from tiny_gguf import tiny_gguf_pair  # noqa: F401  (session fixture)

# Branching at every level, depth 3 (node 7 is three edges below the root).
TREE = Tree([-1, 0, 0, 0, 1, 1, 2, 4])
PATH = [0, 1, 4, 7]                       # a root-to-leaf chain of TREE
VOCAB = 96


def random_ids(count: int, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(2, vocab, (count,), generator=torch.Generator().manual_seed(seed))


def head_rows(model) -> list[int]:
    """Record how many rows each forward runs through the output head."""
    rows: list[int] = []
    model.lm_head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[1]))
    return rows


# -- (a) the transformers backend ----------------------------------------------------------

@pytest.mark.parametrize("stock", [False, True], ids=["redwood", "stock"])
@pytest.mark.parametrize("committed", [0, 5])
@pytest.mark.parametrize("prompt_length", [1, 2, 9, 40])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@torch.inference_mode()
def test_hf_prefill_tree_equals_append_then_run_tree(arch, prompt_length, committed, stock):
    """Logits, cache length, K/V after keep_path and the next token's logits all match the
    two-call route; `committed` tokens are in the cache before (a request after another)."""
    model = tiny_model(arch, vocab_size=VOCAB, seed=3)
    options = dict(preallocate=not stock, gqa_attention=not stock)
    fused, reference = HFBackend(model, **options), HFBackend(model, **options)
    before, ids = random_ids(committed, seed=1), random_ids(prompt_length - 1, seed=prompt_length)
    tokens = random_ids(len(TREE), seed=100 + prompt_length)
    for backend in (fused, reference):
        backend.reset()
        backend.append(before, rows=0)
    rows = head_rows(model)
    logits = fused.prefill_tree(ids, TREE, tokens)
    assert rows == [len(TREE)]                          # no head over the prompt rows
    reference.append(ids, rows=0)
    expected = reference.run_tree(TREE, range(len(TREE)), tokens, reference.cache_length())
    assert logits.shape == (len(TREE), VOCAB)
    assert (logits - expected).abs().max() < 1e-4
    assert fused.cache_length() == reference.cache_length() == committed + prompt_length - 1

    fused.keep_path(PATH)
    reference.keep_path(PATH)
    assert fused.cache_length() == reference.cache_length() == committed + prompt_length - 1 + 4
    for ours, theirs in zip(fused.cache.layers, reference.cache.layers):
        assert ours.keys.shape == theirs.keys.shape
        assert (ours.keys - theirs.keys).abs().max() < 1e-4
        assert (ours.values - theirs.values).abs().max() < 1e-4
    nxt = random_ids(3, seed=7)
    assert (fused.append(nxt, rows=3) - reference.append(nxt, rows=3)).abs().max() < 1e-4


@torch.inference_mode()
def test_hf_prefill_tree_of_the_root_alone_and_refusals():
    """A 1-node tree (an n-gram drafter's first proposal with no match) gives the prompt's
    last row; a pending tree or a token count that does not fit the tree is refused."""
    model = tiny_model("qwen2", vocab_size=VOCAB, seed=4)
    backend, prompt = HFBackend(model), random_ids(12, seed=2)
    root_only = backend.prefill_tree(prompt[:-1], Tree([-1]), prompt[-1:])
    whole = HFBackend(model).append(prompt, rows=1)
    assert (root_only - whole).abs().max() < 1e-4 and backend.cache_length() == 11
    with pytest.raises(RedwoodError, match="keep_path first"):
        backend.prefill_tree(prompt[:3], TREE, random_ids(len(TREE), seed=3))
    backend.keep_path([0])
    with pytest.raises(RedwoodError, match="tokens"):
        backend.prefill_tree(prompt[:3], TREE, random_ids(3, seed=3))


# -- (b) greedy generation with fusion on ---------------------------------------------------

def perturbed(model, noise: float = 0.003, seed: int = 2):
    from test_engine import perturbed as perturb

    return perturb(model, noise, seed)


def count_forwards(model) -> list[int]:
    calls: list[int] = []
    model.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_with_fusion_equals_plain_greedy(arch):
    target = tiny_model(arch, vocab_size=VOCAB, seed=1, dtype=torch.float64, scale=4.0)
    engine = Engine(target, perturbed(target), TREE)
    forwards = count_forwards(target)
    for seed, length in enumerate((1, 2, 6, 30)):
        prompt = random_ids(length, seed=seed)
        reference = engine.generate(prompt, 30, method="autoregressive", stop_on_eos=False)
        for method in ("sequoia", "specinfer", "chain"):
            del forwards[:]
            fused = engine.generate(prompt, 30, method=method, stop_on_eos=False)
            assert fused.tokens == reference.tokens, (method, length)
            assert fused.stats.fused_prefill and fused.as_dict()["fused_prefill"]
            # one target forward per step: no separate prefill forward of the target
            assert len(forwards) == fused.stats.target_forwards, (method, length)
            apart = engine.generate(prompt, 30, method=method, stop_on_eos=False,
                                    fuse_prefill=False)
            assert apart.tokens == reference.tokens and not apart.stats.fused_prefill
            # unfused: the whole prompt's prefill gives the first token (counted as a forward,
            # as for plain decoding), then one forward per step
            assert apart.accepted[0] == 1
            assert len(forwards) == fused.stats.target_forwards + apart.stats.target_forwards


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_with_fusion_and_grown_trees(arch):
    from test_tree_growth import GENTLE, grown_engine

    target = tiny_model(arch, vocab_size=64, seed=1, dtype=torch.float64, scale=30.0)
    draft = tiny_model(arch, vocab_size=64, seed=1, dtype=torch.float64, scale=30.0, num_layers=1)
    engine = grown_engine(target, draft, target_ms=GENTLE, level_ms=0.3)
    for seed in range(3):
        prompt = random_ids(12, seed=seed, vocab=64)
        reference = engine.generate(prompt, 24, method="autoregressive", stop_on_eos=False)
        result = engine.generate(prompt, 24, stop_on_eos=False)
        assert result.tokens == reference.tokens and result.stats.fused_prefill, seed


@pytest.mark.parametrize("kind", ["ngram", "hybrid"])
def test_greedy_with_fusion_and_free_drafters(kind):
    """The first proposal may be the root alone (no n-gram match yet): a 1-node fused tree."""
    from redwood.decode.ngram_drafter import NgramDrafter
    from test_hybrid import hybrid_engine
    from test_ngram import repeated_prompt

    target = tiny_model("qwen2", vocab_size=VOCAB, seed=1, dtype=torch.float64, scale=4.0)
    if kind == "ngram":
        engine = Engine(target, None, TREE, drafter=NgramDrafter())
    else:
        engine = hybrid_engine(target, perturbed(target))
    for prompt in (random_ids(1, seed=5), random_ids(8, seed=6), repeated_prompt(0, VOCAB)):
        reference = engine.generate(prompt, 30, method="autoregressive", stop_on_eos=False)
        result = engine.generate(prompt, 30, stop_on_eos=False)
        assert result.tokens == reference.tokens and result.stats.fused_prefill, prompt


class PlainFirst:
    """A governor that makes the first step plain, then speculates (test double)."""

    def __init__(self, **_):
        self.steps = 0

    def speculate(self) -> bool:
        self.steps += 1
        return self.steps > 1

    def record(self, *_):
        pass

    def as_dict(self) -> dict:
        return {"steps": self.steps}


def test_a_plain_first_step_runs_the_prompt_with_its_root(monkeypatch):
    from redwood.plan.formats import Profile

    monkeypatch.setattr("redwood.decode.engine.Governor", PlainFirst)
    target = tiny_model("llama", vocab_size=VOCAB, seed=1, dtype=torch.float64, scale=4.0)
    profile = Profile({n: 10.0 for n in range(1, 17)}, {w: 1.0 for w in range(1, 17)})
    engine = Engine(target, perturbed(target), TREE, profile=profile)
    for length in (1, 7):
        prompt = random_ids(length, seed=length)
        reference = engine.generate(prompt, 20, method="autoregressive", stop_on_eos=False)
        result = engine.generate(prompt, 20, stop_on_eos=False)
        assert result.tokens == reference.tokens and result.accepted[0] == 1
        assert result.stats.plain_steps == 1 and result.stats.fused_prefill
        assert max(result.accepted) > 1                     # then it speculated


# -- (c) the sampled law with fusion on -----------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("prompt", [[3, 5, 2], [4]], ids=["prompt3", "prompt1"])
def test_first_two_tokens_follow_the_target_with_fusion(prompt):
    from test_engine_exactness import ALPHA, SAMPLES, chi_square_pvalue, exact_joint
    from test_engine_exactness import TREE as EXACT_TREE
    from test_engine_exactness import VOCAB as SMALL

    target = tiny_model("qwen2", vocab_size=SMALL, seed=21, hidden_size=16, num_layers=1, scale=3.0)
    draft = tiny_model("qwen2", vocab_size=SMALL, seed=22, hidden_size=16, num_layers=1, scale=3.0)
    engine, prompt = Engine(target, draft, EXACT_TREE, fuse_prefill=True), torch.tensor(prompt)
    counts, gained = np.zeros(SMALL * SMALL), 0
    for seed in range(SAMPLES):
        result = engine.generate(prompt, 2, temperature=0.6, seed=seed, stop_on_eos=False)
        assert result.stats.fused_prefill
        counts[result.tokens[0] * SMALL + result.tokens[1]] += 1
        gained += result.accepted[0]
    assert gained > SAMPLES * 1.2, "the draft never helped: the test would not exercise trees"
    pvalue = chi_square_pvalue(counts, exact_joint(target, 0.6, 1.0, prompt))
    assert pvalue > ALPHA, f"fused T=0.6: p-value {pvalue:.2e}"


# -- (d) the llama.cpp backend --------------------------------------------------------------

@pytest.mark.parametrize("prompt_length", [1, 9, 40])
def test_llamacpp_prefill_tree_equals_append_then_run_tree(tiny_gguf_pair, prompt_length):
    pytest.importorskip("llama_cpp")
    from redwood.backends.llamacpp import LlamaCppBackend

    options = dict(n_ctx=256, n_seq_max=8, n_batch=16, n_threads=1)     # 40 tokens: 3 chunks
    with LlamaCppBackend(tiny_gguf_pair[0], **options) as fused, \
            LlamaCppBackend(tiny_gguf_pair[0], **options) as reference:
        ids = random_ids(prompt_length - 1, seed=prompt_length, vocab=256)
        tokens = random_ids(len(TREE), seed=50 + prompt_length, vocab=256)
        logits = fused.prefill_tree(ids, TREE, tokens)
        reference.append(ids, rows=0)
        expected = reference.run_tree(TREE, range(len(TREE)), tokens, reference.cache_length())
        assert torch.equal(logits, expected)                # the same two decodes
        assert fused.cache_length() == reference.cache_length() == prompt_length - 1
        fused.keep_path(PATH)
        reference.keep_path(PATH)
        assert fused.cache_length() == reference.cache_length() == prompt_length - 1 + 4
        nxt = random_ids(2, seed=9, vocab=256)
        assert torch.equal(fused.append(nxt, rows=2), reference.append(nxt, rows=2))
