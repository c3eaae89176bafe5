"""The `Backend` contract (src/redwood/backends/base.py), written once and run on every backend.

Each factory builds a backend on a tiny random model; `TOLERANCE` is the largest |logit
difference| a backend may show between a tree/incremental forward and a fresh causal forward of
the same text (different batch shapes take different kernels; see test_llamacpp_backend.py for
how llama.cpp's figure was measured).
"""
from __future__ import annotations

import pytest
import torch

from redwood.plan.tree import Tree
from tiny_gguf import tiny_gguf_pair  # noqa: F401  (session fixture)

# Same tree for every test: root 0; 1, 2 under the root; 3, 4 under 1; 5 under 2; 6 under 3.
PARENTS = [-1, 0, 0, 1, 1, 2, 3]
CHAIN = [0, 1, 3, 6]
PREFIX = [5, 17, 42, 8, 23, 11, 60, 3, 29]
# llamacpp: see test_llamacpp_backend.py (worst measured 6.3e-3; 4.1e-3 in these tests).
# hf: float32 transformers, 6e-8 at most in these tests. hf_stock: the same backend on the stock
# transformers path (torch.cat DynamicCache, sdpa with repeat_kv), which hf's defaults replace.
TOLERANCE = {"llamacpp": 0.03, "hf": 1e-4, "hf_stock": 1e-4}


def _llamacpp(request):
    pytest.importorskip("llama_cpp")
    from redwood.backends.llamacpp import LlamaCppBackend

    target, _ = request.getfixturevalue("tiny_gguf_pair")
    backend = LlamaCppBackend(target, n_ctx=256, n_seq_max=8, n_batch=32, n_threads=1)
    request.addfinalizer(backend.close)
    return backend


def _hf(request):
    try:
        from redwood.backends.hf import HFBackend
    except ImportError as exc:
        pytest.skip(f"HFBackend unavailable: {exc}")
    from redwood.models.tiny_random import tiny_model

    return HFBackend(tiny_model(seed=0))


def _hf_stock(request):
    from redwood.backends.hf import HFBackend
    from redwood.models.tiny_random import tiny_model

    backend = HFBackend(tiny_model(seed=0), preallocate=False, gqa_attention=False)
    assert backend.model.config._attn_implementation == "sdpa"
    return backend


FACTORIES = {"llamacpp": _llamacpp, "hf": _hf, "hf_stock": _hf_stock}


@pytest.fixture(params=sorted(FACTORIES))
def backend(request):
    made = FACTORIES[request.param](request)
    made.reset()
    made.tolerance = TOLERANCE[request.param]
    return made


def tokens_for(backend, count: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, backend.vocab_size, (count,), generator=generator).tolist()


def causal(backend, ids: list[int], rows: int = 1) -> torch.Tensor:
    """Logits of the last `rows` of `ids` decoded causally on an emptied cache."""
    backend.reset()
    return backend.append(ids, rows=rows)


def assert_close(actual, expected, backend):
    assert actual.shape == expected.shape
    diff = (actual - expected).abs().max().item()
    assert diff <= backend.tolerance, f"max |logit diff| {diff} > {backend.tolerance}"
    top = expected.topk(2, dim=-1).values
    clear = (top[:, 0] - top[:, 1]) > 2 * backend.tolerance     # closer margins are ties
    assert torch.equal(actual.argmax(-1)[clear], expected.argmax(-1)[clear])


def test_attributes_and_logits_shape(backend):
    assert backend.vocab_size > 0 and isinstance(backend.name, str) and backend.dtype_name
    assert isinstance(backend.device, torch.device)
    assert isinstance(backend.eos_ids, frozenset)
    logits = backend.append(PREFIX, rows=2)
    assert logits.shape == (2, backend.vocab_size)
    assert logits.dtype == torch.float32 and logits.device.type == backend.device.type
    assert torch.isfinite(logits).all()


def test_append_bookkeeping(backend):
    assert backend.cache_length() == 0
    assert backend.append(PREFIX[:4], rows=0).shape == (0, backend.vocab_size)
    assert backend.cache_length() == 4
    chunked = backend.append(PREFIX[4:], rows=2)
    assert backend.cache_length() == len(PREFIX)
    assert_close(chunked, causal(backend, PREFIX, rows=2), backend)
    assert backend.cache_length() == len(PREFIX)
    backend.reset()
    assert backend.cache_length() == 0


@pytest.mark.parametrize("route", ["run_tree", "prefill_tree"])
def test_whole_tree_then_chain(backend, route):
    """The whole tree after the prefix (run_tree after append, or prefill_tree committing the
    prefix's tail in the same call): its rows are the causal rows, keep_path commits the chain."""
    tree = Tree(PARENTS)
    tokens = torch.tensor(tokens_for(backend, len(tree), seed=1))
    if route == "run_tree":
        backend.append(PREFIX, rows=0)
        logits = backend.run_tree(tree, range(len(tree)), tokens, len(PREFIX))
    else:
        backend.append(PREFIX[:3], rows=0)
        logits = backend.prefill_tree(PREFIX[3:], tree, tokens)
    assert logits.shape == (len(tree), backend.vocab_size)
    assert backend.cache_length() == len(PREFIX)
    backend.keep_path(CHAIN)
    assert backend.cache_length() == len(PREFIX) + len(CHAIN)
    nxt = tokens_for(backend, 1, seed=2)
    after = backend.append(nxt, rows=1)

    text = PREFIX + tokens[CHAIN].tolist()
    reference = causal(backend, text + nxt, rows=len(CHAIN) + 1)
    assert_close(logits[CHAIN], reference[:-1], backend)       # tree rows = causal rows
    assert_close(after, reference[-1:], backend)               # cache = the committed chain


@pytest.mark.parametrize("style", ["verify", "draft"])
def test_keep_nothing_drops_tentative(backend, style):
    tree = Tree(PARENTS)
    tokens = torch.tensor(tokens_for(backend, len(tree), seed=5))
    if style == "verify":
        backend.append(PREFIX, rows=0)
        backend.run_tree(tree, range(len(tree)), tokens, len(PREFIX))
        committed = PREFIX
    else:
        backend.append(PREFIX + [int(tokens[0])], rows=0)
        backend.run_tree(tree, [1, 2], tokens[[1, 2]], len(PREFIX))
        committed = PREFIX + [int(tokens[0])]
    backend.keep_path([])
    assert backend.cache_length() == len(committed)
    nxt = tokens_for(backend, 1, seed=6)
    after = backend.append(nxt, rows=1)
    assert_close(after, causal(backend, committed + nxt), backend)


def test_reset_forgets(backend):
    backend.append(tokens_for(backend, 12, seed=7), rows=0)
    tree = Tree(PARENTS)
    backend.run_tree(tree, range(len(tree)), torch.tensor(tokens_for(backend, len(tree), seed=8)),
                     backend.cache_length())
    backend.reset()
    assert backend.cache_length() == 0
    fresh = backend.append(PREFIX, rows=1)
    assert_close(fresh, causal(backend, PREFIX), backend)
