"""The llama.cpp backend on tiny random GGUF models: tree logits, cache compaction, refusals.

Tolerance. llama.cpp picks different kernels for one-token and multi-token decodes (and the KV
cache is float16), so the same text decoded as a tree, token by token or as one prefill gives
slightly different logits even with float32 weights. Measured on the tiny model (1 and 2
threads alike; random trees of 2-30 nodes, prefixes up to 200 tokens, 150 trials each): tree
vs token-by-token paths at most 3.9e-3, one-token decode vs a fresh prefill at most 6.3e-3,
with logits of standard deviation ~4. TOL = 0.03 is about 5x the worst case and under 1% of the logit scale.
Argmax equality is asserted on every row whose reference top-2 margin exceeds 2 * TOL (a
closer margin is a tie at this precision).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp")

from redwood.backends.gguf_header import read_gguf_metadata  # noqa: E402
from redwood.backends.llamacpp import LlamaCppBackend  # noqa: E402
from redwood.errors import RedwoodError  # noqa: E402
from redwood.plan.tree import Tree, chain, star  # noqa: E402
from tiny_gguf import tiny_gguf_pair, write_non_causal_gguf  # noqa: E402,F401

TOL = 0.03
N_SEQ_MAX, N_BATCH, N_CTX = 16, 64, 512


@pytest.fixture(scope="module")
def target(tiny_gguf_pair):
    return tiny_gguf_pair[0]


@pytest.fixture(scope="module")
def backend(target):
    made = LlamaCppBackend(target, n_ctx=N_CTX, n_seq_max=N_SEQ_MAX, n_batch=N_BATCH, n_threads=1)
    yield made
    made.close()


@pytest.fixture(scope="module")
def reference(target):
    """A second context on the same model: the 'fresh' decodes to compare against."""
    made = LlamaCppBackend(target, n_ctx=N_CTX, n_seq_max=N_SEQ_MAX, n_batch=N_BATCH, n_threads=1)
    yield made
    made.close()


def random_tree(rng, size: int, max_leaves: int = N_SEQ_MAX) -> Tree:
    """A random BFS tree (parents never decrease) with at most max_leaves leaves."""
    while True:
        parents = [-1]
        for i in range(1, size):
            parents.append(int(rng.integers(max(parents[-1], 0), i)))
        tree = Tree(parents)
        if sum(1 for kids in tree.children if not kids) <= max_leaves:
            return tree


def path_to(tree: Tree, node: int) -> list[int]:
    path = [node]
    while path[-1] != 0:
        path.append(tree.parents[path[-1]])
    return path[::-1]


def assert_matches(actual: torch.Tensor, expected: torch.Tensor):
    diff = (actual - expected).abs().max().item()
    assert diff <= TOL, f"max |logit diff| {diff} > {TOL}"
    top = expected.topk(2, dim=-1).values
    clear = (top[:, 0] - top[:, 1]) > 2 * TOL
    assert torch.equal(actual.argmax(-1)[clear], expected.argmax(-1)[clear])


def test_attributes(backend, target):
    assert backend.name == str(target)
    assert backend.vocab_size == 512 and backend.max_positions == N_CTX
    assert backend.device == torch.device("cpu") and backend.dtype_name == "F32"
    assert 266 in backend.eos_ids                    # <|endoftext|>, the file's eos id
    assert backend.n_threads == 1


@pytest.mark.parametrize("seed", range(4))
def test_tree_logits_equal_sequential_paths(backend, reference, seed):
    rng = np.random.default_rng(seed)
    tree = random_tree(rng, int(rng.integers(8, 40)))
    prefix = rng.integers(0, 512, int(rng.integers(1, 30))).tolist()
    tokens = torch.from_numpy(rng.integers(0, 512, len(tree)))
    backend.reset()
    backend.append(prefix, rows=0)
    logits = backend.run_tree(tree, range(len(tree)), tokens, len(prefix))
    backend.keep_path([])
    for leaf in (u for u in range(len(tree)) if not tree.children[u]):
        path = path_to(tree, leaf)
        reference.reset()
        reference.append(prefix, rows=0)
        sequential = torch.cat([reference.append([int(tokens[u])]) for u in path])
        assert_matches(logits[path], sequential)


def test_append_in_chunks(backend, reference):
    """More tokens than n_batch go in several decodes; the rows asked for span chunks."""
    rng = np.random.default_rng(11)
    ids = rng.integers(0, 512, 2 * N_BATCH + 22).tolist()
    backend.reset()
    logits = backend.append(ids, rows=N_BATCH + 10)
    assert logits.shape == (N_BATCH + 10, 512) and backend.cache_length() == len(ids)
    assert mem_positions(backend, 0) == (0, len(ids) - 1)
    reference.reset()
    reference.append(ids[:len(ids) - N_BATCH - 10], rows=0)
    one_by_one = torch.cat([reference.append([t]) for t in ids[len(ids) - N_BATCH - 10:]])
    assert_matches(logits, one_by_one)


def mem_positions(backend, seq: int) -> tuple[int, int]:
    return (llama_cpp.llama_memory_seq_pos_min(backend._mem, seq),
            llama_cpp.llama_memory_seq_pos_max(backend._mem, seq))


def test_many_steps_keep_cache_equal_to_fresh_prefill(backend, reference):
    """Random trees, verified whole or drafted level by level, then a random accepted path:
    afterwards sequence 0 holds exactly the committed text and nothing else is cached."""
    rng = np.random.default_rng(7)
    backend.reset()
    committed = rng.integers(0, 512, 5).tolist()
    backend.append(committed, rows=0)
    for step in range(24):
        tree = random_tree(rng, int(rng.integers(2, 24)))
        tokens = torch.from_numpy(rng.integers(0, 512, len(tree)))
        draft_style = step % 2 == 1
        if draft_style:                               # root committed, then level by level
            backend.append([int(tokens[0])], rows=1)
            committed.append(int(tokens[0]))
            root = backend.cache_length() - 1
            levels = [lvl.tolist() for lvl in tree.levels[1:]]
            levels = levels[:int(rng.integers(0, len(levels) + 1))]
            for level in levels:
                backend.run_tree(tree, level, tokens[level], root)
            ran = [u for lvl in levels for u in lvl]
        else:
            backend.run_tree(tree, range(len(tree)), tokens, backend.cache_length())
            ran = list(range(len(tree)))
        if step % 5 == 4 or not ran:
            keep = []
        else:
            path = path_to(tree, int(rng.choice(ran)))
            keep = path[1:] if draft_style else path
            keep = keep[:int(rng.integers(1, len(keep) + 1))] if keep else []
        backend.keep_path(keep)
        committed += tokens[keep].tolist()
        assert backend.cache_length() == len(committed)
        assert mem_positions(backend, 0) == (0, len(committed) - 1)
        for seq in range(1, N_SEQ_MAX):
            assert mem_positions(backend, seq) == (-1, -1), f"cells left in sequence {seq}"
    nxt = [int(rng.integers(0, 512))]
    after = backend.append(nxt)
    reference.reset()
    assert_matches(after, reference.append(committed + nxt))


# -- refusals: each raises RedwoodError before llama.cpp could abort, and the process lives on --

def test_too_many_leaves(backend):
    wide = star(N_SEQ_MAX + 1)                        # N_SEQ_MAX + 1 leaves
    with pytest.raises(RedwoodError, match="leaves"):
        backend.check_tree(wide)
    backend.reset()
    backend.append([1, 2, 3], rows=0)
    with pytest.raises(RedwoodError, match="sequences"):
        backend.run_tree(wide, range(len(wide)), torch.zeros(len(wide), dtype=torch.long), 3)
    assert backend.cache_length() == 3
    assert backend.append([4]).shape == (1, 512)


def test_too_many_nodes(backend):
    long = chain(N_BATCH + 1)
    with pytest.raises(RedwoodError, match="nodes"):
        backend.check_tree(long)
    backend.reset()
    backend.append([1, 2, 3], rows=0)
    with pytest.raises(RedwoodError, match="per forward"):
        backend.run_tree(long, range(len(long)), torch.zeros(len(long), dtype=torch.long), 3)
    assert backend.append([4]).shape == (1, 512)


def test_context_overflow(backend):
    n_ctx = backend.n_ctx
    backend.reset()
    with pytest.raises(RedwoodError, match="context overflow"):
        backend.append([7] * (n_ctx + 1), rows=0)
    assert backend.cache_length() == 0
    backend.append([7] * (n_ctx - 3), rows=0)
    tree = chain(5)
    with pytest.raises(RedwoodError, match="n_ctx"):
        backend.run_tree(tree, range(5), torch.zeros(5, dtype=torch.long), n_ctx - 3)
    assert backend.cache_length() == n_ctx - 3
    assert backend.append([1, 2, 3]).shape == (1, 512)   # exactly full still works
    with pytest.raises(RedwoodError, match="context overflow"):
        backend.append([1])
    with pytest.raises(RedwoodError, match="context overflow"):
        backend.append_logits_view([1])                    # the one-token fast path
    assert backend.cache_length() == n_ctx
    backend.reset()


def test_one_token_view_equals_append(backend, reference):
    """append_logits_view([t]) (the plain step's fast path) gives append's row and cache."""
    backend.reset()
    reference.reset()
    backend.append([5, 9, 14], rows=0)
    reference.append([5, 9, 14], rows=0)
    for token in (3, 77, 200, 3):
        row = backend.append_logits_view([token]).copy()
        assert_matches(torch.from_numpy(row)[None], reference.append([token]))
    assert backend.cache_length() == reference.cache_length() == 7
    assert backend._tokens == [5, 9, 14, 3, 77, 200, 3]
    for bad in (512, -1):
        with pytest.raises(RedwoodError, match="out of range"):
            backend.append_logits_view([bad])
    assert backend.cache_length() == 7
    backend.reset()


def test_token_out_of_range(backend):
    backend.reset()
    with pytest.raises(RedwoodError, match="out of range"):
        backend.append([1, 512])
    with pytest.raises(RedwoodError, match="out of range"):
        backend.append([-1])
    assert backend.cache_length() == 0
    backend.append([1, 2], rows=0)
    with pytest.raises(RedwoodError, match="out of range"):
        backend.run_tree(chain(2), [0, 1], torch.tensor([3, 100000]), 2)
    assert backend.append([3]).shape == (1, 512)


def test_not_a_gguf_file(tmp_path):
    text = tmp_path / "model.gguf"
    text.write_text("this is not a model\n")
    with pytest.raises(RedwoodError, match="not a GGUF file"):
        LlamaCppBackend(text)
    with pytest.raises(RedwoodError, match="not found"):
        LlamaCppBackend(tmp_path / "missing.gguf")


def test_truncated_gguf(tmp_path, target):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(target.read_bytes()[:200])
    with pytest.raises(RedwoodError, match="truncated or corrupt"):
        LlamaCppBackend(cut)


def test_header_reader_agrees_with_gguf_package(target, tmp_path):
    from gguf import GGUFReader, GGUFValueType

    for path in (target, write_non_causal_gguf(tmp_path / "bert.gguf")):
        fields = GGUFReader(str(path)).fields
        expected = {key: None if field.types[0] == GGUFValueType.ARRAY else field.contents()
                    for key, field in fields.items() if not key.startswith("GGUF.")}
        assert read_gguf_metadata(path) == expected


def test_unloadable_gguf_says_why(tmp_path):
    import gguf

    path = tmp_path / "empty-qwen2.gguf"                # a causal architecture, no weights
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(RedwoodError, match="could not load.*qwen2.context_length"):
        LlamaCppBackend(path)


def test_encoder_architecture_is_refused(tmp_path):
    path = write_non_causal_gguf(tmp_path / "bert.gguf", arch="bert")
    with pytest.raises(RedwoodError, match="'bert'.*not a causal language model"):
        LlamaCppBackend(path)


def test_misuse_is_refused(backend):
    backend.reset()
    backend.append([1, 2, 3], rows=0)
    tree = Tree([-1, 0, 0, 1])
    with pytest.raises(RedwoodError, match="root_position"):
        backend.run_tree(tree, range(4), torch.zeros(4, dtype=torch.long), 7)
    with pytest.raises(RedwoodError, match="has not been run"):
        backend.run_tree(tree, [3], torch.zeros(1, dtype=torch.long), 3)
    backend.run_tree(tree, range(4), torch.zeros(4, dtype=torch.long), 3)
    with pytest.raises(RedwoodError, match="keep_path first"):
        backend.append([1])
    with pytest.raises(RedwoodError, match="chain"):
        backend.keep_path([0, 2, 3])
    backend.keep_path([0, 1])
    assert backend.cache_length() == 5


def test_close_is_idempotent(target):
    made = LlamaCppBackend(target, n_ctx=64, n_seq_max=2, n_batch=8, n_threads=1)
    made.append([1, 2, 3])
    made.close()
    made.close()
    with pytest.raises(RedwoodError, match="closed"):
        made.append([1])
