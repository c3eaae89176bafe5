"""The transformers backend's two cheaper-step paths (docs/design.md §5.2) against the stock ones:
`redwood_sdpa` (grouped-query attention without repeat_kv) and the preallocated cache
(hf_cache.PreallocLayer), on tiny Qwen2/Llama models with 2 KV heads under 4 query heads."""
from __future__ import annotations

import random

import pytest
import torch

from redwood.backends import hf_attention, hf_cache
from redwood.backends.hf import HFBackend
from redwood.plan.tree import Tree
from tiny import tiny_model

VOCAB = 64


def _tree_forward(model, prompt, tree_tokens, visible):
    """Logits [q, V] of tree tokens over a fresh stock cache holding `prompt`."""
    cache = hf_cache.new_cache(model, preallocate=False)
    hf_cache.forward(model, prompt, torch.arange(len(prompt)), cache)
    mask = hf_cache.tree_attention_mask(len(prompt), visible, model.dtype)
    depths = visible.sum(1) - 1                                # chain-closed visibility: depth = ancestors
    return hf_cache.forward(model, tree_tokens, len(prompt) + depths, cache, mask)


def _inputs(seed: int, q: int = 7):
    gen = torch.Generator().manual_seed(seed)
    tree = Tree([-1, 0, 0, 1, 1, 2, 3][:q])
    return (torch.randint(0, VOCAB, (11,), generator=gen), torch.randint(0, VOCAB, (q,), generator=gen),
            torch.as_tensor(tree.ancestor_mask()))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_gqa_attention_equals_stock_sdpa(arch):
    model = tiny_model(arch, vocab_size=VOCAB, seed=4)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    prompt, tokens, visible = _inputs(seed=1)
    hf_attention.use_stock_attention(model)
    stock = _tree_forward(model, prompt, tokens, visible)
    assert hf_attention.use_gqa_attention(model)
    ours = _tree_forward(model, prompt, tokens, visible)
    assert model.config._attn_implementation == hf_attention.NAME
    torch.testing.assert_close(ours, stock, rtol=0, atol=1e-6)
    # and both equal the plain causal forward of the path to node 6 (0 -> 1 -> 3 -> 6)
    path = torch.cat([prompt, tokens[[0, 1, 3, 6]]])
    causal = model(input_ids=path[None]).logits[0, -1]
    torch.testing.assert_close(ours[6], causal, rtol=0, atol=1e-4)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_gqa_attention_runs_sdpa_on_unrepeated_heads(arch, monkeypatch):
    """Spy on torch's sdpa: with a tree mask, stock transformers hands it K/V repeated to all
    query heads; redwood_sdpa hands it the kv_heads K/V with enable_gqa."""
    model = tiny_model(arch, vocab_size=VOCAB, seed=5)
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, *args, **kwargs):
        seen.append((query.shape[2], key.shape[1], kwargs.get("enable_gqa", False)))
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    prompt, tokens, visible = _inputs(seed=2)
    layers, kv_heads = model.config.num_hidden_layers, model.config.num_key_value_heads
    hf_attention.use_stock_attention(model)
    _tree_forward(model, prompt, tokens, visible)
    assert seen[-layers:] == [(7, model.config.num_attention_heads, False)] * layers
    hf_attention.use_gqa_attention(model)
    _tree_forward(model, prompt, tokens, visible)
    assert seen[-layers:] == [(7, kv_heads, True)] * layers


def test_gqa_switch_leaves_other_implementations_alone():
    model = tiny_model("qwen2", vocab_size=VOCAB, seed=6)
    model.set_attn_implementation("eager")
    assert not hf_attention.use_gqa_attention(model)
    assert model.config._attn_implementation == "eager"
    HFBackend(model)                                            # the backend's default is the same call
    assert model.config._attn_implementation == "eager"


def _random_step(backends, rng: random.Random):
    """One verify-like step on every backend: a random tree over the committed prefix, then a
    random root-to-node path kept. Returns each backend's logits [n, V]."""
    parents = [-1]
    for i in range(1, rng.randint(1, 9)):                      # BFS order: parents never decrease
        parents.append(rng.randint(max(parents[-1], 0), i - 1))
    tree = Tree(parents)
    tokens = torch.tensor([rng.randrange(VOCAB) for _ in parents])
    node = rng.randrange(len(parents))
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    keep = list(reversed(path))[: rng.randint(0, len(path))]
    outs = []
    for backend in backends:
        logits = backend.run_tree(tree, range(len(tree)), tokens, backend.cache_length())
        backend.keep_path(keep)
        outs.append(logits)
    return outs


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_preallocated_cache_equals_dynamic_cache_over_many_steps(arch, monkeypatch):
    """Small MIN_CAPACITY so 60 steps grow the buffers several times; also the draft pattern
    (level-by-level run_tree) and chunked appends go through both caches."""
    monkeypatch.setattr(hf_cache, "MIN_CAPACITY", 8)
    model = tiny_model(arch, vocab_size=VOCAB, seed=7, dtype=torch.float64)
    stock = HFBackend(model, preallocate=False, gqa_attention=False)
    ours = HFBackend(model, preallocate=True, gqa_attention=False)
    assert all(isinstance(layer, hf_cache.PreallocLayer) for layer in ours.cache.layers)
    rng = random.Random(3)
    prompt = [rng.randrange(VOCAB) for _ in range(5)]
    torch.testing.assert_close(ours.append(prompt, rows=2), stock.append(prompt, rows=2), rtol=0, atol=0)
    for step in range(60):
        a, b = _random_step([stock, ours], rng)
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12)
        if step % 20 == 19:                                     # a chunk appended causally
            more = [rng.randrange(VOCAB) for _ in range(3)]
            torch.testing.assert_close(ours.append(more), stock.append(more), rtol=0, atol=1e-12)
    assert ours.cache_length() == stock.cache_length() > 64
    capacity = ours.cache.layers[0]._stores[0].shape[2]
    assert capacity >= ours.cache_length() and capacity & (capacity - 1) == 0   # doubled, power of 2
    for mine, theirs in zip(ours.cache.layers, stock.cache.layers):
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=0, atol=1e-12)
        torch.testing.assert_close(mine.values, theirs.values, rtol=0, atol=1e-12)


def test_reset_reuses_buffers_and_forgets():
    model = tiny_model("qwen2", vocab_size=VOCAB, seed=8)
    backend = HFBackend(model)
    backend.append(list(range(2, 40)), rows=0)
    buffer = backend.cache.layers[0]._stores[0].data_ptr()
    backend.reset()
    assert backend.cache_length() == 0
    fresh = backend.append([5, 9, 11], rows=1)
    assert backend.cache.layers[0]._stores[0].data_ptr() == buffer
    stock = HFBackend(tiny_model("qwen2", vocab_size=VOCAB, seed=8), preallocate=False, gqa_attention=False)
    torch.testing.assert_close(fresh, stock.append([5, 9, 11], rows=1), rtol=0, atol=1e-6)


def test_cache_written_in_inference_mode_then_outside_and_after_crop():
    """Buffers are normal tensors, so inference_mode and plain callers can share a cache; a
    transformers-side crop (a shorter view) is picked up by the next write."""
    model = tiny_model("llama", vocab_size=VOCAB, seed=9, dtype=torch.float64)
    ours, stock = (HFBackend(model, preallocate=p, gqa_attention=False) for p in (True, False))
    for backend in (ours, stock):
        with torch.inference_mode():
            backend.append([3, 4, 5, 6, 7, 8], rows=0)
        hf_cache.crop(backend.cache, 4)
    assert ours.cache_length() == 4
    torch.testing.assert_close(ours.append([9, 10], rows=2), stock.append([9, 10], rows=2), rtol=0, atol=1e-12)
