"""The batching scheduler's prefix cache (serve/prefix_reuse.py over llamacpp_multi's cached
lanes and radix tree), on the tiny GGUF pair of test_batching: lookup against a brute-force
scan, reuse and divergence with outputs equal to a fresh engine, LRU eviction under a budget,
one evaluation of a prefix shared by concurrent requests, a disconnect mid-prefill, and a
soak of mixed requests whose cells stay within the bound and consistent with llama.cpp."""
from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("llama_cpp")

from redwood.backends.radix_tree import RadixTree, common_prefix  # noqa: E402
from redwood.decode.params import SamplingParams  # noqa: E402
from redwood.serve.batch_requests import BatchRequest  # noqa: E402
from test_batching import (CLEAR_PROMPTS, assert_all_free, context, engine,  # noqa: E402,F401
                           paths, scheduler)
from tiny_gguf import tiny_gguf_pair  # noqa: E402,F401


@pytest.fixture
def contexts(paths):
    made = [context(path) for path in paths]
    yield made
    for ctx in made:
        ctx.close()


def greedy(engine, prompt, n):
    return engine.generate(torch.tensor(prompt), n, stop_on_eos=False).tokens


# -- the radix tree -------------------------------------------------------------------------

def brute_force(sequences: dict, query) -> tuple[int, frozenset]:
    best = max((common_prefix(seq, query) for seq in sequences.values()), default=0)
    return best, frozenset(o for o, seq in sequences.items() if common_prefix(seq, query) >= best)


def test_radix_lookup_equals_a_brute_force_scan():
    """Random inserts, replacements and removals over a 4-token vocabulary (many shared
    prefixes and splits): every lookup's length and owners equal a scan of all sequences."""
    rng = random.Random(0)
    tree, sequences = RadixTree(), {}
    for step in range(3000):
        owner = rng.randrange(12)
        action = rng.random()
        if action < 0.45:
            seq = [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
            tree.insert(owner, seq)
            sequences[owner] = tuple(seq)
        elif action < 0.6 and owner in sequences:
            tree.remove(owner)
            del sequences[owner]
        query = [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
        if sequences and rng.random() < 0.5:          # often a cached sequence, extended
            query = list(rng.choice(list(sequences.values()))) + query[:3]
        assert tree.longest_prefix(query) == brute_force(sequences, query), step
        assert len(tree) == len(sequences)


def test_common_prefix_long_and_short():
    a = list(range(500))
    assert common_prefix(a, a + [1]) == 500
    assert common_prefix(a, a[:200] + [-1] + a[201:]) == 200
    assert common_prefix([1, 2, 3], [1, 2]) == 2 and common_prefix([], [1]) == 0


# -- reuse ----------------------------------------------------------------------------------

def test_by_default_other_caches_go_when_a_request_starts(contexts):
    """cache_tokens 0 (the default): the last finished request stays cached until another
    request starts; one that reuses it keeps it, an unrelated one evicts it."""
    sched = scheduler(contexts)
    a = sched.submit(BatchRequest(CLEAR_PROMPTS[0] * 3, SamplingParams(6), stop_on_eos=False))
    sched.run(1000)
    index = contexts[0].index

    def cached():       # the cached sequences (a tree's accepted tokens past max_tokens too)
        return [index.sequence(i) for i in range(len(contexts[0].lanes)) if i in index]

    assert [seq[:len(a.prompt) + 5] for seq in cached()] == [tuple(a.prompt + a.tokens[:5])]
    b = sched.submit(BatchRequest(CLEAR_PROMPTS[1] * 3, SamplingParams(6), stop_on_eos=False))
    sched.run(1000)
    assert b.cached_tokens == 0
    assert [seq[:len(b.prompt) + 5] for seq in cached()] == [tuple(b.prompt + b.tokens[:5])]
    assert sched.cache_stats.evictions == 1
    assert_all_free(*contexts)


def test_a_second_turn_reuses_the_first_and_matches_a_fresh_engine(contexts, engine):
    """Turn 2's prompt = turn 1's prompt + its answer + a new message: every cell turn 1
    committed is reused (the answer's last token was never run), the output equals the
    single-request engine's on the whole prompt, and nothing is reused with the cache off."""
    sched = scheduler(contexts)
    first = sched.submit(BatchRequest(CLEAR_PROMPTS[0], SamplingParams(20), stop_on_eos=False))
    sched.run(1000)
    assert first.cached_tokens == 0
    turn2 = CLEAR_PROMPTS[0] + first.tokens + CLEAR_PROMPTS[1]
    second = sched.submit(BatchRequest(turn2, SamplingParams(20), stop_on_eos=False))
    sched.run(1000)
    assert second.cached_tokens == len(CLEAR_PROMPTS[0]) + len(first.tokens) - 1
    assert second.tokens == greedy(engine, turn2, 20)
    fresh = sched.submit(BatchRequest(turn2, SamplingParams(20), stop_on_eos=False,
                                      cache_prompt=False))
    sched.run(1000)
    assert fresh.cached_tokens == 0 and fresh.tokens == second.tokens
    assert sched.cache_stats.hits >= 1 and sched.cache_stats.lookups == 2
    assert_all_free(*contexts)


def test_divergence_mid_prefix_keeps_only_the_shared_cells(contexts, engine):
    sched = scheduler(contexts)
    base = CLEAR_PROMPTS[4] + CLEAR_PROMPTS[6]                   # 16 tokens
    sched.submit(BatchRequest(base, SamplingParams(8), stop_on_eos=False))
    sched.run(1000)
    other = base[:10] + CLEAR_PROMPTS[2]
    request = sched.submit(BatchRequest(other, SamplingParams(20), stop_on_eos=False))
    sched.run(1000)
    assert request.cached_tokens == 10
    assert request.tokens == greedy(engine, other, 20)
    assert_all_free(*contexts)


def test_lru_eviction_under_a_budget(contexts):
    """cache_tokens = 30 besides the last finished request's cache: the least recently used
    goes first, and a hit refreshes a cache's place."""
    sched = scheduler(contexts, cache_tokens=30)         # cached: 15, 21 and 13 cells
    prompts = [CLEAR_PROMPTS[i] * 2 for i in (0, 1, 2)]
    for prompt in prompts[:2]:
        sched.submit(BatchRequest(prompt, SamplingParams(10), stop_on_eos=False))
        sched.run(1000)
    again = sched.submit(BatchRequest(prompts[0], SamplingParams(10), stop_on_eos=False))
    sched.run(1000)                                       # prompts[0] is now the newest
    assert again.cached_tokens == len(prompts[0]) - 1
    sched.submit(BatchRequest(prompts[2], SamplingParams(10), stop_on_eos=False))
    sched.run(1000)
    target = contexts[0]
    assert target.idle_cells() <= 30 + 13 and sched.cache_stats.evictions == 1
    cached = {tuple(target.index.sequence(i)[:5]) for i in range(len(target.lanes))
              if i in target.index}
    assert tuple(prompts[1][:5]) not in cached and tuple(prompts[0][:5]) in cached
    assert_all_free(*contexts)


# -- concurrent requests share one evaluation -------------------------------------------------

def test_a_shared_system_prompt_is_evaluated_once(contexts, engine):
    """Four requests sharing a 48-token prefix, submitted together, prefilled 8 tokens a step:
    the target runs the prefix once (the others wait, then share its cells), and every output
    equals the request alone."""
    system = (CLEAR_PROMPTS[4] + CLEAR_PROMPTS[6] + CLEAR_PROMPTS[1]) * 2          # 44 tokens
    prompts = [system + CLEAR_PROMPTS[i] for i in range(4)]
    sched = scheduler(contexts, prefill_chunk=8)
    requests = [sched.submit(BatchRequest(p, SamplingParams(15), stop_on_eos=False))
                for p in prompts]
    evaluated = 0
    while sched.step():
        evaluated += sched.last.prompt_tokens
    unique = sum(len(p) - 1 - len(system) for p in prompts)
    assert evaluated == len(system) + unique
    assert sched.cache_stats.shared_tokens == 3 * len(system)
    assert all(r.cached_tokens == len(system) for r in requests[1:])
    for request, prompt in zip(requests, prompts):
        assert request.tokens == greedy(engine, prompt, 15)
    assert_all_free(*contexts)


def test_a_request_cancelled_mid_prefill_leaves_only_evaluated_cells(contexts, engine):
    long_prompt = CLEAR_PROMPTS[0] * 12                               # 36 tokens
    sched = scheduler(contexts, prefill_chunk=8)
    gone = sched.submit(BatchRequest(long_prompt, SamplingParams(10), stop_on_eos=False))
    for _ in range(2):
        sched.step()                                                  # 16 tokens prefilled
    gone.cancel()
    sched.step()
    assert gone.finish_reason == "cancelled"
    assert_all_free(*contexts)
    assert max(lane.length for lane in contexts[0].lanes) == 16
    again = sched.submit(BatchRequest(long_prompt, SamplingParams(20), stop_on_eos=False))
    sched.run(1000)
    assert again.cached_tokens == 16 and again.tokens == greedy(engine, long_prompt, 20)


# -- bounded under a soak ---------------------------------------------------------------------

def test_soak_of_mixed_requests_stays_bounded_and_consistent(contexts):
    """200 requests (shared prefixes, follow-up turns, cache off, cancellations, sampled and
    greedy), up to 4 at a time with a 300-cell budget: idle caches never exceed it (besides the
    last finished request's), cells never exceed the context, every lane's cells match its
    tokens in llama.cpp, and none is lost."""
    rng = random.Random(1)
    sched = scheduler(contexts, cache_tokens=300)
    history: list[list[int]] = []
    finished = 0
    for i in range(200):
        if history and rng.random() < 0.4:                            # a follow-up turn
            prompt = rng.choice(history) + rng.choice(CLEAR_PROMPTS)
        else:
            prompt = CLEAR_PROMPTS[rng.randrange(8)] * rng.randrange(1, 5)
        prompt = prompt[-120:]
        request = sched.submit(BatchRequest(
            prompt, SamplingParams(rng.randrange(1, 24), rng.choice([0.0, 0.8]), seed=i),
            stop_on_eos=False, cache_prompt=rng.random() > 0.1))
        if rng.random() < 0.1:
            request.cancel()
        while len(sched.live) + len(sched.waiting) >= 4 or (i == 199 and not sched.idle):
            sched.step()
            for ctx in contexts:
                assert ctx.used_cells() <= ctx.n_ctx
                spare = max((x.length for x in ctx.lanes if not x.busy), default=0)
                assert ctx.idle_cells() <= 300 + spare, ctx.idle_cells()
        history = (history + [prompt + request.tokens])[-6:]
        finished += request.done
    assert sched.idle and sched.cache_stats.lookups > 150 and sched.cache_stats.hits > 30
    assert sched.cache_stats.evictions > 0
    assert_all_free(*contexts)
