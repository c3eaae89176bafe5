"""Engine correctness on tiny random models: tree attention, greedy equality,
cache consistency, reproducibility and input validation."""
import copy

import pytest
import torch

from redwood.backends import hf_cache as kvcache
from redwood.decode.engine import Engine
from redwood.errors import RedwoodError
from redwood.plan.tree import Tree
from tiny import tiny_model

TREES = {
    "chain5": [-1, 0, 1, 2, 3],
    "star4": [-1, 0, 0, 0, 0],
    "wide_deep": [-1, 0, 0, 0, 1, 1, 2, 4, 4, 7, 9, 10],
    "deep_chain": [-1, 0, 1, 2, 3, 4, 5, 6, 7],
}


def perturbed(model, noise: float, seed: int):
    """A draft that agrees with the target often but not always."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(noise * torch.randn(param.shape, generator=gen, dtype=param.dtype))
    return draft


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request):
    target = tiny_model(request.param, vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    return target, perturbed(target, 0.003, seed=2)


@pytest.mark.parametrize("name", list(TREES))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@torch.inference_mode()
def test_tree_logits_equal_sequential_paths(arch, name):
    model = tiny_model(arch, vocab_size=96, seed=3, dtype=torch.float64)
    tree = Tree(TREES[name])
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 96, (7,), generator=gen)
    nodes = torch.randint(0, 96, (len(tree),), generator=gen)
    nodes[0] = prompt[-1]
    cache = kvcache.new_cache(model)
    kvcache.forward(model, prompt[:-1], torch.arange(6), cache)
    mask = kvcache.tree_attention_mask(6, torch.as_tensor(tree.ancestor_mask()), model.dtype)
    logits = kvcache.forward(model, nodes, 6 + torch.as_tensor(tree.depths), cache, mask)
    for node in range(len(tree)):
        path = [node]
        while tree.parents[path[-1]] > 0:
            path.append(tree.parents[path[-1]])
        sequence = torch.cat([prompt, nodes[list(reversed(path))]]) if node else prompt
        expected = model(input_ids=sequence[None]).logits[0, -1]
        torch.testing.assert_close(logits[node], expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", list(TREES))
def test_greedy_methods_equal_autoregressive(pair, name):
    target, draft = pair
    engine = Engine(target, draft, Tree(TREES[name]))
    gains = []
    for seed in range(3):
        prompt = torch.randint(2, 96, (5 + seed,), generator=torch.Generator().manual_seed(seed))
        reference = engine.generate(prompt, 40, method="autoregressive", stop_on_eos=False)
        assert len(reference.tokens) == 40 and reference.accepted == [1] * 40
        for method in ("sequoia", "specinfer", "chain"):
            result = engine.generate(prompt, 40, method=method, stop_on_eos=False)
            assert result.tokens == reference.tokens, (method, name, seed)
            assert sum(result.accepted) == len(result.tokens)
            assert result.stats.target_forwards == len(result.accepted)
            gains.append(result.tokens_per_step)
    # The draft is close to the target, so trees must actually gain tokens.
    assert max(gains) > 1.5


def test_caches_equal_fresh_prefill_after_many_steps(pair):
    target, draft = pair
    engine = Engine(target, draft, Tree(TREES["wide_deep"]))
    prompt = torch.randint(2, 96, (6,), generator=torch.Generator().manual_seed(7))
    # Stop after 15 steps, well before max_new_tokens, so no step was truncated.
    stream = engine.stream(prompt, 400, temperature=0.8, seed=3, stop_on_eos=False)
    for steps, _ in enumerate(stream, start=1):
        if steps == 15:
            break
    state = stream.state
    full = torch.cat([prompt, torch.tensor(stream.state.tokens)])
    assert len(full) > len(prompt) + 15
    # Target cache: everything but the newest token (the next root).
    assert state.target.cache_length() == len(full) - 1
    _assert_cache_matches(target, state.target.cache, full[:-1])
    # Draft cache: everything but its pending tokens and the root.
    drafter = state.drafter
    cached = len(full) - 1 - len(drafter.pending)
    assert drafter.backend.cache_length() == cached
    _assert_cache_matches(draft, drafter.backend.cache, full[:cached])


@pytest.mark.parametrize("name", ["wide_deep", "deep_chain"])
def test_pruned_trees_keep_greedy_output_and_shrink_with_the_threshold(pair, name):
    target, draft = pair
    engine = Engine(target, draft, Tree(TREES[name]))
    prompt = torch.randint(2, 96, (6,), generator=torch.Generator().manual_seed(4))
    reference = engine.generate(prompt, 40, method="autoregressive", stop_on_eos=False)
    sizes = []
    for confidence in (0.0, 0.5, 0.9, 0.99):
        for method in ("sequoia", "specinfer", "chain"):
            result = engine.generate(prompt, 40, method=method, stop_on_eos=False,
                                     draft_confidence=confidence)
            assert result.tokens == reference.tokens, (method, confidence)
            assert sum(result.accepted) == len(result.tokens)
        sizes.append(result.stats.draft_tokens_per_step)    # chain's mean tree size
    # A higher threshold prunes more, and some threshold prunes without emptying the tree.
    assert sizes[0] == Tree(TREES[name]).num_levels - 1      # unpruned: the whole chain
    assert all(a >= b for a, b in zip(sizes, sizes[1:])), sizes
    assert any(1 <= s < sizes[0] for s in sizes[1:]), sizes


def test_caches_stay_consistent_when_pruning(pair):
    target, draft = pair
    engine = Engine(target, draft, Tree(TREES["wide_deep"]))
    prompt = torch.randint(2, 96, (6,), generator=torch.Generator().manual_seed(8))
    stream = engine.stream(prompt, 400, temperature=0.8, seed=5, stop_on_eos=False,
                           draft_confidence=0.6)
    for steps, _ in enumerate(stream, start=1):
        if steps == 15:
            break
    state, full = stream.state, torch.cat([prompt, torch.tensor(stream.state.tokens)])
    assert state.stats.tree_nodes < 15 * (len(TREES["wide_deep"]) - 1)     # it did prune
    _assert_cache_matches(target, state.target.cache, full[:-1])
    cached = len(full) - 1 - len(state.drafter.pending)
    _assert_cache_matches(draft, state.drafter.backend.cache, full[:cached])


def _assert_cache_matches(model, cache, sequence):
    fresh = kvcache.new_cache(model)
    with torch.inference_mode():
        kvcache.forward(model, sequence, torch.arange(len(sequence)), fresh)
    assert kvcache.cache_length(cache) == len(sequence)
    for ours, theirs in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=1e-9)
        torch.testing.assert_close(ours.values, theirs.values, rtol=0, atol=1e-9)


@pytest.mark.parametrize("method", ["sequoia", "specinfer", "chain", "autoregressive"])
def test_seeded_sampling_is_reproducible(pair, method):
    target, draft = pair
    engine = Engine(target, draft, Tree(TREES["wide_deep"]))
    prompt = torch.tensor([[3, 4, 5, 6]])
    runs = [engine.generate(prompt, 30, temperature=1.0, top_p=0.9, seed=s, method=method,
                            stop_on_eos=False).tokens for s in (11, 11, 12)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_stream_yields_the_same_tokens_as_generate(pair):
    target, draft = pair
    engine = Engine(target, draft, Tree(TREES["star4"]))
    prompt = torch.tensor([7, 8, 9])
    stream = engine.stream(prompt, 25, stop_on_eos=False)
    pieces = list(stream)
    assert [t for piece in pieces for t in piece] == stream.result.tokens
    assert [len(piece) for piece in pieces] == stream.result.accepted
    assert stream.result.tokens == engine.generate(prompt, 25, stop_on_eos=False).tokens


def test_stops_at_eos(pair):
    target, draft = pair
    engine = Engine(target, draft, Tree(TREES["chain5"]))
    prompt = torch.tensor([7, 8, 9])
    free = engine.generate(prompt, 40, stop_on_eos=False).tokens
    engine.eos_ids = {free[5]}
    stopped = engine.generate(prompt, 40)
    first = free.index(free[5])
    assert stopped.tokens == free[: first + 1] and stopped.finish_reason == "eos"


@pytest.mark.parametrize("kwargs, message", [
    (dict(input_ids=torch.tensor([], dtype=torch.long)), "empty"),
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=1000), "context"),
    (dict(method="beam"), "method"),
    (dict(input_ids=torch.tensor([1, 500])), "token ids"),
    (dict(input_ids=torch.ones(2, 3, dtype=torch.long)), "1-D"),
    (dict(draft_confidence=-0.1), "draft_confidence"),
    (dict(draft_confidence=1.0), "draft_confidence"),
    (dict(draft_confidence="high"), "draft_confidence"),
])
def test_bad_requests_raise_clear_errors(pair, kwargs, message):
    target, draft = pair
    engine = Engine(target, draft, Tree(TREES["chain5"]))
    args = dict(input_ids=torch.tensor([3, 4]), max_new_tokens=10) | kwargs
    with pytest.raises(RedwoodError, match=message):
        engine.generate(**args)


def test_vocabulary_mismatch_is_refused():
    target = tiny_model("qwen2", vocab_size=96)
    draft = tiny_model("qwen2", vocab_size=80)
    with pytest.raises(RedwoodError, match="96.*80|80.*96"):
        Engine(target, draft, Tree(TREES["chain5"]))


def test_closing_a_stream_keeps_what_was_generated(pair):
    target, draft = pair
    engine = Engine(target, draft, Tree(TREES["chain5"]))
    stream = engine.stream(torch.tensor([7, 8, 9]), 200, stop_on_eos=False)
    seen = []
    for piece in stream:
        seen += piece
        if len(seen) >= 10:
            stream.close()
    assert stream.result.finish_reason == "stopped"
    assert stream.result.tokens == seen and sum(stream.result.accepted) == len(seen)


def test_a_request_can_bring_its_own_tree(pair):
    target, draft = pair
    engine = Engine(target, draft, Tree(TREES["chain5"]))
    prompt = torch.tensor([7, 8, 9])
    deep = engine.generate(prompt, 30, stop_on_eos=False)
    star = engine.generate(prompt, 30, stop_on_eos=False, tree=Tree(TREES["star4"]))
    assert star.tokens == deep.tokens
    assert max(star.accepted) <= 2 < max(deep.accepted)     # a star gains at most one draft token
    with pytest.raises(RedwoodError, match="redwood.Tree"):
        engine.generate(prompt, 5, tree=[-1, 0])


def test_an_int8_draft_is_accepted_and_stays_exact_in_greedy():
    from redwood.models.cpu_kernels import quantize_int8

    target = tiny_model("qwen2", vocab_size=96, seed=1, scale=4.0)
    draft = quantize_int8(perturbed(target, 0.003, seed=2))
    engine = Engine(target, draft, Tree(TREES["wide_deep"]))
    prompt = torch.tensor([5, 6, 7])
    reference = engine.generate(prompt, 20, method="autoregressive", stop_on_eos=False)
    assert engine.generate(prompt, 20, stop_on_eos=False).tokens == reference.tokens


def test_a_second_stream_ends_the_first_with_a_clear_error(pair):
    """A backend holds one sequence: starting another stream on the same engine must not
    silently corrupt the first one."""
    target, draft = pair
    engine = Engine(target, draft, Tree(TREES["chain5"]))
    first = engine.stream(torch.tensor([3, 4, 5]), 30, stop_on_eos=False)
    iterator = iter(first)
    next(iterator)
    second = engine.generate(torch.tensor([6, 7]), 10, stop_on_eos=False)
    assert len(second.tokens) == 10
    with pytest.raises(RedwoodError, match="another generation started"):
        next(iterator)


def test_engine_accepts_backends_and_sampling_params(pair):
    from redwood.backends.hf import HFBackend
    from redwood.decode.params import SamplingParams

    target, draft = pair
    by_models = Engine(target, draft, Tree(TREES["star4"]))
    by_backends = Engine(HFBackend(target), HFBackend(draft), Tree(TREES["star4"]))
    params = SamplingParams(max_new_tokens=20, temperature=0.7, seed=4)
    a = by_models.generate(torch.tensor([3, 4, 5]), params=params, stop_on_eos=False)
    b = by_backends.generate(torch.tensor([3, 4, 5]), 20, temperature=0.7, seed=4, stop_on_eos=False)
    assert a.tokens == b.tokens and len(a.tokens) == 20
