"""The engine end to end on llama.cpp (tiny random GGUF models): greedy equality with the same
backend's autoregressive output, chi-square exactness of sampling, cache state after many steps,
and the refusals that must come before any native call (docs/design.md §1, §4, §5.3).

The pair: the target is the session's tiny model of seed 0 (tiny_gguf.tiny_gguf_pair); the draft
is the same model with 10% relative weight noise (`write_perturbed_gguf`), so it agrees with the
target often but not always (first-token acceptance about 0.7 at T = 1 on the chi-square prompt;
1.5-3 greedy tokens per step), and acceptance, rejection, residuals and bonus tokens all occur.

Near-ties. llama.cpp runs one-token and multi-token decodes with different kernels (max |logit
difference| about 4e-3 on these models, see test_llamacpp_backend.py), so a tree verify can pick
another argmax than the one-token decode where the target's top-2 margin is below that.
Measured: over 300 random prompts, 40 greedy tokens each, `sequoia` on the wide-deep tree
differed from autoregressive on 7 prompts, always at a position whose top-2 margin was at most
0.006 (the first differing position's margins: 0.0002-0.006); 176 of the 300 prompts had some
position with a margin below 0.03. The greedy prompts below were chosen for clear margins (at
least 0.15 on every position) and the test checks that precondition, so an inequality here is a
real bug, not a near-tie.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp")

from redwood.backends.llamacpp import LlamaCppBackend  # noqa: E402
from redwood.decode.engine import Engine  # noqa: E402
from redwood.decode.sampling import process_logits  # noqa: E402
from redwood.errors import RedwoodError  # noqa: E402
from redwood.plan.tree import Tree, chain, star  # noqa: E402
from test_llamacpp_backend import TOL, assert_matches  # noqa: E402
from test_verify import assert_law  # noqa: E402
from tiny_gguf import tiny_gguf_pair, write_perturbed_gguf, write_tiny_gguf  # noqa: E402,F401

N_CTX, N_SEQ_MAX, N_BATCH = 512, 16, 64
DRAFT_NOISE = 0.1
TREES = {
    "chain5": [-1, 0, 1, 2, 3],
    "star4": [-1, 0, 0, 0, 0],
    "wide_deep": [-1, 0, 0, 0, 1, 1, 2, 4, 4, 7, 9, 10],
    "deep_chain": [-1, 0, 1, 2, 3, 4, 5, 6, 7],
}
# Prompts whose 40 greedy target tokens all have a top-2 margin of at least 0.15 (found by
# scanning random prompts; min margins 0.197, 0.211, 0.152), far above the kernel noise.
GREEDY_PROMPTS = [[240, 58, 20, 146, 72, 66], [257, 108, 134, 109, 144, 105, 207],
                  [83, 20, 59, 191, 48, 144]]
METHODS = ("sequoia", "specinfer", "chain")


def backend_for(path, **limits) -> LlamaCppBackend:
    options = dict(n_ctx=N_CTX, n_seq_max=N_SEQ_MAX, n_batch=N_BATCH, n_threads=1) | limits
    return LlamaCppBackend(path, **options)


@pytest.fixture(scope="module")
def paths(tiny_gguf_pair, tmp_path_factory):
    """(target, draft) GGUF paths: the session's seed-0 model and a perturbed copy of it."""
    target = tiny_gguf_pair[0]
    directory = tmp_path_factory.mktemp("engine_llamacpp")
    draft = write_perturbed_gguf(directory / "tiny-seed0-noisy.gguf", 0, DRAFT_NOISE)
    return target, draft


@pytest.fixture(scope="module")
def backends(paths):
    made = [backend_for(path) for path in paths]
    yield made
    for backend in made:
        backend.close()


@pytest.fixture(scope="module")
def reference(paths):
    """Fresh contexts on the same two files: prefills to compare the engine's caches against."""
    made = [backend_for(path) for path in paths]
    yield made
    for backend in made:
        backend.close()


def greedy_margins(backend, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The target's top-2 logit margin at each generated position (one fresh prefill)."""
    backend.reset()
    logits = backend.append(prompt + tokens, rows=len(tokens) + 1)[:-1]
    assert logits.argmax(-1).tolist() == tokens, "prefill argmax differs from autoregressive"
    top = logits.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


# -- 1. greedy: every method equals the same backend's autoregressive output ----------------

@pytest.mark.parametrize("name", list(TREES))
def test_greedy_methods_equal_autoregressive(backends, reference, name):
    target, draft = backends
    engine = Engine(target, draft, Tree(TREES[name]))
    gains = []
    for prompt in GREEDY_PROMPTS:
        ids = torch.tensor(prompt)
        expected = engine.generate(ids, 40, method="autoregressive", stop_on_eos=False)
        assert len(expected.tokens) == 40 and expected.accepted == [1] * 40
        margins = greedy_margins(reference[0], prompt, expected.tokens)
        assert margins.min() > 2 * TOL, f"prompt {prompt} has a near-tie: not a fair test"
        for method in METHODS:
            result = engine.generate(ids, 40, method=method, stop_on_eos=False)
            if result.tokens != expected.tokens:
                at = next(i for i, (a, b) in enumerate(zip(result.tokens, expected.tokens))
                          if a != b)
                pytest.fail(f"{method} on {name}, prompt {prompt}: differs at token {at} "
                            f"(target top-2 margin there {margins[at]:.4f})")
            assert sum(result.accepted) == 40
            assert result.stats.target_forwards == len(result.accepted)
            gains.append(result.tokens_per_step)
    # The perturbed draft agrees with the target often: trees must actually gain tokens.
    assert max(gains) > 1.5, gains


def test_pruned_trees_keep_greedy_output(backends):
    target, draft = backends
    engine = Engine(target, draft, Tree(TREES["wide_deep"]))
    ids = torch.tensor(GREEDY_PROMPTS[0])
    expected = engine.generate(ids, 40, method="autoregressive", stop_on_eos=False).tokens
    for confidence in (0.5, 0.9):
        sizes = {}
        for method in METHODS:
            result = engine.generate(ids, 40, method=method, stop_on_eos=False,
                                     draft_confidence=confidence)
            assert result.tokens == expected, (method, confidence)
            sizes[method] = result.stats.draft_tokens_per_step
        assert sizes["sequoia"] < len(TREES["wide_deep"]) - 1, sizes      # it did prune


# -- 2. exactness: the first two tokens follow the target's own law on this backend --------

CHI_PROMPT = [72, 101, 108, 108, 111]       # "Hello": a spread-out first-token law
CHI_TREE = Tree([-1, 0, 0, 0, 1, 1, 2, 4])  # width 3 at the root, then narrower
CHI_DRAWS = 2000


@pytest.fixture(scope="module")
def target_logits(backends):
    """The target backend's own logits: [V] after the prompt, and [V, V] after the prompt plus
    each possible first token (fresh prefills)."""
    target = backends[0]
    target.reset()
    first = target.append(CHI_PROMPT)[0]
    second = []
    for token in range(target.vocab_size):
        target.reset()
        second.append(target.append(CHI_PROMPT + [token])[0])
    target.reset()
    return first, torch.stack(second)


def joint_law(first, second, temperature, top_p) -> dict:
    """{(first, second): probability} with the engine's processing (float64 products)."""
    p1 = process_logits(first, temperature, 0, top_p).double()
    p2 = process_logits(second, temperature, 0, top_p).double()
    joint = (p1[:, None] * p2).numpy()
    return {(int(a), int(b)): float(joint[a, b]) for a, b in zip(*np.nonzero(joint))}


@pytest.mark.slow          # 4-9 s each on 2 cores (2000 draws of ~2 ms); ~45 s for the section
@pytest.mark.parametrize("method, temperature, top_p", [
    ("sequoia", 0.6, 1.0), ("specinfer", 0.6, 1.0), ("chain", 0.6, 1.0),
    ("sequoia", 1.0, 1.0), ("specinfer", 1.0, 1.0), ("chain", 1.0, 1.0),
    ("sequoia", 1.0, 0.8)])
def test_first_two_tokens_follow_the_target(backends, target_logits, method,
                                            temperature, top_p):
    """Chi-square (alpha 1e-3) against the law enumerated from the target backend's logits.
    Those come from prefills, the engine's from tree verifies: the kernels differ by at most
    ~4e-3 in logits, under 1% in any probability, far below what 2000 draws can resolve."""
    engine = Engine(*backends, CHI_TREE)
    counts, gained = Counter(), 0
    for seed in range(CHI_DRAWS):
        result = engine.generate(torch.tensor(CHI_PROMPT), 2, temperature=temperature,
                                 top_p=top_p, seed=seed, method=method, stop_on_eos=False)
        counts[tuple(result.tokens)] += 1
        # the first token comes from the prompt's prefill (as plain llama.cpp's), the second
        # from verifying a tree below it: did a draft child survive?
        assert result.accepted[0] == 1 and result.stats.tree_nodes > 0
        gained += result.stats.accepted_at_depth[0]
    # Both branches of the rule must be exercised: accepted draft tokens and all-rejected steps.
    assert 0.3 * CHI_DRAWS < gained < 0.98 * CHI_DRAWS, gained
    assert_law(counts, joint_law(*target_logits, temperature, top_p), CHI_DRAWS)


@pytest.mark.slow
def test_chi_square_tells_the_draft_from_the_target(backends):
    """Power check: the draft's own law of the first two tokens is rejected by the same test
    on draws of the engine (TV(p, q) is about 0.3 at the first token)."""
    engine = Engine(*backends, CHI_TREE)
    draft = backends[1]
    draft.reset()
    first = draft.append(CHI_PROMPT)[0]
    second = []
    for token in range(draft.vocab_size):
        draft.reset()
        second.append(draft.append(CHI_PROMPT + [token])[0])
    law = joint_law(first, torch.stack(second), 1.0, 1.0)
    counts = Counter(tuple(engine.generate(torch.tensor(CHI_PROMPT), 2, temperature=1.0, seed=s,
                                           stop_on_eos=False).tokens) for s in range(CHI_DRAWS))
    with pytest.raises(AssertionError, match="chi-square"):
        assert_law(counts, law, CHI_DRAWS)


# -- 3. cache state after many steps ---------------------------------------------------------

def seq_pos_max(backend, seq: int) -> int:
    return llama_cpp.llama_memory_seq_pos_max(backend._mem, seq)


def assert_cache_is_prefill_of(backend, fresh, text: list[int], probe: int):
    """backend's cache holds exactly `text` in sequence 0 (and nothing elsewhere): same
    length, same last position, and the same next-token logits as a fresh prefill after
    appending `probe` to both."""
    assert backend.cache_length() == len(text)
    assert seq_pos_max(backend, 0) == len(text) - 1
    for seq in range(1, backend.n_seq_max):
        assert seq_pos_max(backend, seq) == -1, f"cells left in sequence {seq}"
    after = backend.append([probe])
    fresh.reset()
    assert_matches(after, fresh.append(text + [probe]))


@pytest.mark.parametrize("confidence", [0.0, 0.6])
def test_caches_equal_fresh_prefill_after_many_steps(backends, reference, confidence):
    target, draft = backends
    tree = Tree(TREES["wide_deep"])
    engine = Engine(target, draft, tree)
    prompt = torch.tensor([7, 200, 31, 64, 90, 5])
    # Stop after 15 steps, well before max_new_tokens, so no step was truncated.
    stream = engine.stream(prompt, 400, temperature=0.8, seed=3, stop_on_eos=False,
                           draft_confidence=confidence)
    for steps, _ in enumerate(stream, start=1):
        if steps == 15:
            break
    state = stream.state
    full = prompt.tolist() + state.tokens
    assert len(full) > len(prompt) + 15 + 5            # the draft helped
    if confidence:
        assert state.stats.tree_nodes < 15 * (len(tree) - 1)      # it did prune
    # Target: everything but the newest token (the next root).
    assert state.target is target
    assert_cache_is_prefill_of(target, reference[0], full[:-1], probe=full[-1])
    # Draft: everything but its pending tokens and the root.
    cached = len(full) - 1 - len(state.drafter.pending)
    assert state.drafter.backend is draft
    assert_cache_is_prefill_of(draft, reference[1], full[:cached], probe=full[cached])


# -- 4. refusals through the engine, before any native call ---------------------------------

@pytest.fixture
def small(paths, monkeypatch):
    """(target, draft) with n_seq_max 4 and n_batch 16, each counting its llama_decode calls
    in `.decodes`."""
    made = [backend_for(path, n_ctx=256, n_seq_max=4, n_batch=16) for path in paths]
    for backend in made:
        backend.decodes = []
        original = backend._decode

        def counting(what, original=original, calls=backend.decodes):
            calls.append(what)
            return original(what)

        monkeypatch.setattr(backend, "_decode", counting)
    yield made
    for backend in made:
        backend.close()


def assert_refused_before_decoding(engine, small, tree, method, match):
    """A fitting request first (the backends hold state), then the refused one: it raises at
    `stream` and at `generate`, decodes nothing and leaves both caches as they were."""
    ids = torch.tensor([5, 6, 7, 8])
    engine.generate(ids, 6, tree=chain(3), stop_on_eos=False)
    lengths = [b.cache_length() for b in small]
    decodes = [len(b.decodes) for b in small]
    with pytest.raises(RedwoodError, match=match):
        engine.stream(ids, 6, method=method, tree=tree)
    with pytest.raises(RedwoodError, match=match):
        engine.generate(ids, 6, method=method, tree=tree, temperature=1.0, seed=0)
    assert [len(b.decodes) for b in small] == decodes
    assert [b.cache_length() for b in small] == lengths
    assert len(engine.generate(ids, 6, tree=chain(3), stop_on_eos=False).tokens) == 6


@pytest.mark.parametrize("method", ["sequoia", "specinfer"])
def test_more_leaves_than_sequences_is_refused(small, method):
    engine = Engine(*small, chain(3))
    assert_refused_before_decoding(engine, small, star(5), method, "5 leaves.*at most 4")
    # The chain method runs one child per level: a 2-level chain fits.
    assert len(engine.generate(torch.tensor([5, 6]), 6, method="chain", tree=star(5),
                               stop_on_eos=False).tokens) == 6


@pytest.mark.parametrize("method", ["sequoia", "specinfer", "chain"])
def test_more_nodes_than_the_batch_is_refused(small, method):
    engine = Engine(*small, chain(3))
    assert_refused_before_decoding(engine, small, chain(17), method, "17 nodes.*at most 16")


@pytest.mark.parametrize("limited", ["target", "draft"])
def test_either_backend_limits_the_tree(paths, small, limited):
    """The tree must fit both models: one small backend is enough to refuse it."""
    large = [backend_for(path) for path in paths]
    try:
        pair = [small[0], large[1]] if limited == "target" else [large[0], small[1]]
        engine = Engine(*pair, chain(3))
        with pytest.raises(RedwoodError, match="leaves"):
            engine.generate(torch.tensor([5, 6]), 6, tree=star(5))
        with pytest.raises(RedwoodError, match="nodes"):
            engine.generate(torch.tensor([5, 6]), 6, tree=chain(17))
        assert all(len(b.decodes) == 0 for b in small)
    finally:
        for backend in large:
            backend.close()


@pytest.mark.parametrize("method", ["autoregressive", "sequoia"])
def test_request_beyond_the_context_is_refused(small, method):
    engine = Engine(*small, chain(3))
    n_ctx = small[0].n_ctx                  # llama.cpp pads n_ctx (256 here, as asked)
    assert engine.max_positions == n_ctx
    prompt = torch.arange(10) + 40
    with pytest.raises(RedwoodError, match=rf"context of {n_ctx} positions"):
        engine.stream(prompt, n_ctx - 10, method=method)
    assert all(len(b.decodes) == 0 for b in small)
    # At the limit (prompt + max_new_tokens + tree nodes = n_ctx) a chain tree completes.
    result = engine.generate(prompt, n_ctx - 10 - 3, method=method, stop_on_eos=False)
    assert len(result.tokens) == n_ctx - 13


def test_wide_tree_at_the_context_limit_completes(paths):
    """star(12): 13 nodes, 2 levels. A llama.cpp verify takes one cache cell per tree node,
    so the engine counts nodes (Backend.room_needed), not depth: one token more than fits is
    refused up front, and a request exactly at the limit completes (no mid-stream overflow)."""
    pair = [backend_for(path, n_ctx=256) for path in paths]
    try:
        engine = Engine(*pair, star(12))
        n_ctx = pair[0].n_ctx
        prompt = torch.arange(10) + 40
        with pytest.raises(RedwoodError, match="context"):
            engine.stream(prompt, n_ctx - 10 - 13 + 1, stop_on_eos=False)
        max_new = n_ctx - 10 - 13
        result = engine.generate(prompt, max_new, stop_on_eos=False)
        assert len(result.tokens) == max_new
    finally:
        for backend in pair:
            backend.close()


def test_vocabulary_mismatch_is_refused(paths, tmp_path):
    other = write_tiny_gguf(tmp_path / "tiny-vocab520.gguf", 2, vocab=520)
    target = backend_for(paths[0], n_ctx=256, n_seq_max=2, n_batch=8)
    draft = backend_for(other, n_ctx=256, n_seq_max=2, n_batch=8)
    try:
        with pytest.raises(RedwoodError, match="vocabularies differ.*512.*520"):
            Engine(target, draft, chain(3))
        with pytest.raises(RedwoodError, match="vocabularies differ.*520.*512"):
            Engine(draft, target, chain(3))
    finally:
        target.close()
        draft.close()


# -- 4. the plain path reads the logits in place (append_logits_view) ----------------------

def test_plain_path_equals_token_by_token_appends(backends, reference):
    """Greedy autoregressive decoding (the in-place row and numpy's argmax) gives exactly the
    tokens of a loop of append(rows=1) + torch argmax on a fresh context."""
    for prompt in GREEDY_PROMPTS:
        got = Engine(*backends, Tree([-1])).generate(torch.tensor(prompt), 30,
                                                     method="autoregressive",
                                                     stop_on_eos=False).tokens
        fresh = reference[0]
        fresh.reset()
        logits, expected = fresh.append(prompt, rows=1), []
        for _ in range(30):
            expected.append(int(logits[0].argmax()))
            logits = fresh.append([expected[-1]], rows=1)
        assert got == expected


@pytest.mark.slow
@pytest.mark.parametrize("temperature, top_p", [(0.6, 1.0), (1.0, 1.0), (1.0, 0.8)])
def test_plain_path_first_two_tokens_follow_the_target(backends, target_logits,
                                                       temperature, top_p):
    """The second token comes from a plain step's in-place sampler (top-p 0.8: the torch path
    on the same in-place row); chi-square against the target backend's own law."""
    engine = Engine(*backends, Tree([-1]))
    counts = Counter()
    for seed in range(CHI_DRAWS):
        result = engine.generate(torch.tensor(CHI_PROMPT), 2, temperature=temperature,
                                 top_p=top_p, seed=seed, method="autoregressive",
                                 stop_on_eos=False)
        counts[tuple(result.tokens)] += 1
    assert_law(counts, joint_law(*target_logits, temperature, top_p), CHI_DRAWS)


# -- 5. the first token comes from the whole prompt's prefill --------------------------------

class CallLog:
    """Records the target backend's forwards (name, length) while delegating them."""

    def __init__(self, backend, monkeypatch):
        self.calls: list[tuple[str, int]] = []
        for name in ("append", "run_tree", "prefill_tree", "append_logits_view"):
            original = getattr(backend, name)

            def logged(*args, _name=name, _original=original, **kwargs):
                self.calls.append((_name, len(args[0]) if _name != "run_tree" else len(args[1])))
                return _original(*args, **kwargs)
            monkeypatch.setattr(backend, name, logged)


@pytest.mark.parametrize("drafter", ["draft", "ngram"])
def test_speculative_first_token_is_the_whole_prompt_prefill(backends, monkeypatch, drafter):
    """llama.cpp's kernels differ by batch shape, so a near-tie at the first token resolves
    as plain llama.cpp's (and llama-server's) only if it comes from the same forward: the
    whole prompt in one append, not prompt[:-1] and then a tree under its last token."""
    from redwood.decode.ngram_drafter import NgramDrafter

    target, draft = backends
    engine = Engine(target, draft if drafter == "draft" else None, Tree(TREES["wide_deep"]),
                    drafter=NgramDrafter() if drafter == "ngram" else None)
    prompt = GREEDY_PROMPTS[1] * 3
    log = CallLog(target, monkeypatch)
    result = engine.generate(torch.tensor(prompt), 12, stop_on_eos=False, cache_prompt=False)
    assert log.calls[0] == ("append", len(prompt))
    assert "prefill_tree" not in {name for name, _ in log.calls}
    if drafter == "draft":                         # trees below the first token
        assert "run_tree" in {name for name, _ in log.calls[1:]}
    assert result.accepted[0] == 1 and not result.stats.fused_prefill
    assert result.prefill_seconds > 0
    plain = engine.generate(torch.tensor(prompt), 12, method="autoregressive", stop_on_eos=False)
    assert result.tokens == plain.tokens
