"""Cross-request memory for the n-gram drafter (decode/ngram_memory.py): lookups equal a
brute-force scan of the stored streams across adds and evictions, the store stays bounded,
a later request drafts from an earlier one's output (and not when opted out), and the engine
with memory proposals stays exact (chi-square of sampling, greedy equality on both backends)."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from redwood.decode.drafter import ChildChooser
from redwood.decode.engine import Engine
from redwood.decode.layout import TreeLayout
from redwood.decode.ngram_drafter import NgramDrafter
from redwood.decode.ngram_index import Continuation
from redwood.decode.ngram_memory import NgramMemory, merge_continuations
from redwood.errors import RedwoodError
from redwood.plan.tree import Tree, chain, star
from test_ngram import longest_common_suffix
from tiny import tiny_model
from tiny_gguf import tiny_gguf_pair  # noqa: F401  (session fixture)

WIDE_DEEP = Tree([-1, 0, 0, 0, 1, 1, 2, 4, 4, 7, 9, 10])
GREEDY = ChildChooser(True)


def layout(tree: Tree) -> TreeLayout:
    return TreeLayout.build(tree, "cpu")


# -- (a) lookups equal a brute-force scan, across adds and evictions --------------------------

def brute_memory_candidates(streams, suffix, min_n, max_n, max_occurrences, max_continuations,
                            max_length, max_match=32):
    """The definition, by scanning every stored stream: for n = max_n..min_n the most recent
    max_occurrences occurrences (stream order, then position) of the suffix's last n tokens
    that have a next token in their stream, skipping those taken at a longer n, each one's match
    the common suffix of the suffix and its stream up to it (capped at max_match); grouped by
    what followed. Returns [(tokens, match, count, recency)] best first."""
    taken: dict[tuple[int, int], int] = {}           # (stream, end) -> match length
    for n in range(max_n, min_n - 1, -1):
        if n > len(suffix):
            continue
        gram = list(suffix[len(suffix) - n:])
        ends = [(i, e) for i, stream in enumerate(streams)
                for e in range(n - 1, len(stream) - 1) if stream[e - n + 1:e + 1] == gram]
        for i, e in ends[-max_occurrences:]:
            taken.setdefault((i, e), longest_common_suffix(streams[i][:e + 1], list(suffix),
                                                           max_match))
    groups: dict[tuple, list] = {}
    for (i, e), m in taken.items():
        follow = tuple(streams[i][e + 1:e + 1 + max_length])
        match, count, recent = groups.get(follow, (0, 0, (-1, -1)))
        groups[follow] = [max(match, m), count + 1, max(recent, (i, e))]
    ranked = sorted(groups.items(), key=lambda kv: tuple(kv[1]), reverse=True)
    return [(follow, *stats) for follow, stats in ranked[:max_continuations]]


def fifo(stored: list[list[int]], stream: list[int], max_tokens: int) -> list[list[int]]:
    """The streams a FIFO store of max_tokens tokens holds after adding `stream`."""
    stream = stream[-max_tokens:]
    if not stream:
        return stored
    stored = list(stored)
    while stored and sum(map(len, stored)) + len(stream) > max_tokens:
        stored.pop(0)
    return stored + [stream]


def assert_matches_brute_force(memory, stored, suffix, continuations, length):
    got = memory.candidates(suffix, continuations, length)
    expected = brute_memory_candidates(stored, suffix, memory.min_n, memory.max_n,
                                       memory.max_occurrences, continuations, length,
                                       memory.max_match)
    assert [(c.tokens, c.match, c.count) for c in got] == [e[:3] for e in expected]
    assert all(c.last < 0 for c in got)               # older than any in-request occurrence
    for a in range(len(got)):                         # `last` orders as the brute recency
        for b in range(a + 1, len(got)):
            assert (got[a].last < got[b].last) == (expected[a][3] < expected[b][3])


def assert_bookkeeping(memory: NgramMemory):
    assert memory.tokens == sum(map(len, memory.streams())) <= memory.max_tokens
    assert memory.entries == sum(len(ends) for table in memory.positions.values()
                                 for ends in table.values())
    assert memory.entries <= (memory.max_n - memory.min_n + 1) * memory.tokens


@settings(max_examples=120, deadline=None)
@given(streams=st.lists(st.lists(st.integers(0, 3), max_size=14), min_size=1, max_size=8),
       suffixes=st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=5),
       max_tokens=st.integers(4, 40), min_n=st.integers(1, 3), extra=st.integers(0, 3),
       occurrences=st.integers(1, 5), continuations=st.integers(1, 6), length=st.integers(1, 6))
def test_memory_candidates_equal_brute_force(streams, suffixes, max_tokens, min_n, extra,
                                             occurrences, continuations, length):
    memory = NgramMemory(max_tokens, min_n, min_n + extra, occurrences,
                         max_match=min_n + extra + len(suffixes))
    stored: list[list[int]] = []
    for stream in streams:
        memory.add(stream)
        stored = fifo(stored, stream, max_tokens)
        assert memory.streams() == stored
        assert_bookkeeping(memory)
        for suffix in suffixes + [stream[-4:], stream[-12:]]:
            assert_matches_brute_force(memory, stored, suffix, continuations, length)


def test_memory_candidates_equal_brute_force_random_soak():
    """Longer streams than hypothesis draws, many evictions, a vocabulary of 5."""
    rng = random.Random(7)
    memory = NgramMemory(max_tokens=300, min_n=1, max_n=4, max_occurrences=6)
    stored: list[list[int]] = []
    for _ in range(60):
        stream = [rng.randrange(5) for _ in range(rng.randrange(0, 120))]
        memory.add(stream)
        stored = fifo(stored, stream, 300)
        assert memory.streams() == stored
        assert_bookkeeping(memory)
        for _ in range(5):
            suffix = [rng.randrange(5) for _ in range(rng.randrange(1, 40))]
            assert_matches_brute_force(memory, stored, suffix, rng.randrange(1, 9),
                                       rng.randrange(1, 9))


def test_bad_settings_are_refused():
    for bad in (dict(max_tokens=0), dict(min_n=0), dict(min_n=3, max_n=2),
                dict(max_occurrences=0)):
        with pytest.raises(RedwoodError):
            NgramMemory(**bad)


# -- (b) bounded under a soak ------------------------------------------------------------------

MARK = 1000                  # stream i starts with the token MARK + i, found nowhere else


def test_soak_stays_bounded_and_forgets_evicted_streams():
    """500 streams of 2..2101 tokens into 2000: the bounds hold after every add, and a
    stream's marker is found exactly while that stream (with its head) is stored."""
    rng = random.Random(0)
    memory = NgramMemory(max_tokens=2000, min_n=1, max_n=5, max_occurrences=8)
    stored: list[list[int]] = []
    evictions = 0
    for i in range(500):
        length = rng.choice([rng.randrange(1, 60), rng.randrange(60, 400), 2100])
        stream = [MARK + i] + [rng.randrange(20) for _ in range(length)]
        memory.add(stream)
        evictions += len(stored) + 1 - len(fifo(stored, stream, 2000))
        stored = fifo(stored, stream, 2000)
        assert memory.tokens <= 2000 and memory.streams() == stored
        assert memory.entries <= (memory.max_n - memory.min_n + 1) * memory.tokens
        assert sum(len(table) for table in memory.positions.values()) <= memory.entries
        heads = {s[0] for s in stored}
        for j in rng.sample(range(i + 1), min(i + 1, 20)):
            assert bool(memory.candidates([MARK + j], 4, 4)) == (MARK + j in heads), (i, j)
    assert_bookkeeping(memory)
    assert evictions > 400                           # the soak really evicted


# -- (c) the drafter with memory -----------------------------------------------------------

SPAN = [40, 41, 42, 43, 44, 45, 46, 47]


def feed(drafter: NgramDrafter, prompt: list[int], generated: list[int]) -> None:
    """One request as the engine drives it: prefill prompt[:-1], then plain steps whose
    roots are the prompt's last token and the generated tokens (the last one is the final
    bonus, never committed)."""
    drafter.prefill(torch.tensor(prompt[:-1]))
    for root in [prompt[-1]] + generated[:-1]:
        drafter.skip(root)


def second_request(drafter: NgramDrafter) -> list[int]:
    """A prompt without SPAN whose output starts repeating it: the proposal at SPAN[0]."""
    drafter.prefill(torch.tensor([20, 21, 22]))
    drafter.commit([0], drafter.propose(23, layout(chain(12)), GREEDY).tokens)
    return drafter.propose(SPAN[0], layout(chain(12)), GREEDY).tokens.tolist()


def test_second_request_drafts_from_the_first():
    memory = NgramMemory()
    drafter = NgramDrafter(memory=memory)
    feed(drafter, [10, 11, 12, 13], SPAN + [50, 51])
    drafter.finish()
    assert memory.streams() == [[13] + SPAN + [50]]
    assert second_request(drafter) == SPAN + [50]    # the root, then 8 tokens from memory


def test_no_memory_or_opted_out_drafts_nothing():
    plain = NgramDrafter()
    feed(plain, [10, 11, 12, 13], SPAN + [50, 51])
    plain.finish()                                    # no memory: a no-op
    assert second_request(plain) == [SPAN[0]]
    memory = NgramMemory()
    drafter = NgramDrafter(memory=memory)
    feed(drafter, [10, 11, 12, 13], SPAN + [50, 51])
    drafter.finish()
    drafter.use_memory = False                        # this request: no lookups in memory
    assert second_request(drafter) == [SPAN[0]]
    drafter.use_memory = True
    drafter.prefill(torch.tensor([1]))                # the opted-out request was not stored
    assert len(memory) == 1


def test_finish_is_idempotent_and_prefill_finishes_a_forgotten_request():
    memory = NgramMemory()
    drafter = NgramDrafter(memory=memory)
    feed(drafter, [10, 11], SPAN)
    drafter.finish()
    drafter.finish()
    assert memory.streams() == [[11] + SPAN[:-1]]
    feed(drafter, [3, 4], [5, 6, 7])                  # never finished...
    feed(drafter, [8, 9], [1, 2])                     # ...so this prefill stored it
    assert memory.streams() == [[11] + SPAN[:-1], [4, 5, 6]]


def test_opt_out_is_kept_by_the_request_it_was_set_for():
    """A request that started with use_memory False is not stored, even when the next
    request's setting (True) is made before the prefill that finishes it; and setting
    use_memory False before finish() also opts out."""
    memory = NgramMemory()
    drafter = NgramDrafter(memory=memory)
    drafter.use_memory = False
    feed(drafter, [10, 11], [12, 13])
    drafter.use_memory = True
    feed(drafter, [20, 21], [22, 23])
    drafter.use_memory = False
    drafter.finish()
    drafter.use_memory = True
    feed(drafter, [30, 31], [32, 33])
    drafter.finish()
    assert memory.streams() == [[31, 32]]


def test_merge_ranks_by_match_then_request_first_on_ties():
    ours = [Continuation((1, 2), 1, 1, 5)]
    theirs = [Continuation((3, 4), 1, 1, -1), Continuation((5,), 2, 1, -9),
              Continuation((1, 2), 1, 2, -3)]
    merged = merge_continuations(ours, theirs, 8)
    assert merged == [Continuation((5,), 2, 1, -9), Continuation((1, 2), 1, 3, 5),
                      Continuation((3, 4), 1, 1, -1)]
    assert merge_continuations(ours, theirs, 2) == merged[:2]
    tie = merge_continuations([Continuation((1,), 1, 1, 0)], [Continuation((3,), 1, 1, -1)], 8)
    assert [c.tokens for c in tie] == [(1,), (3,)]


def test_drafter_siblings_from_request_and_memory():
    """'7' was followed by 1 in the prompt and by 3 in memory: the request's 1 ranks first;
    a longer match in memory ('2 7' -> 5) ranks above both."""
    memory = NgramMemory()
    memory.add([7, 3, 4])
    drafter = NgramDrafter(memory=memory)
    drafter.prefill(torch.tensor([7, 1, 2]))
    assert drafter.propose(7, layout(star(4)), GREEDY).tokens.tolist() == [7, 1, 3]
    memory.add([2, 7, 5])
    drafter.prefill(torch.tensor([7, 1, 2]))
    assert drafter.propose(7, layout(star(4)), GREEDY).tokens.tolist() == [7, 5, 1, 3]


# -- (d) chi-square exactness with memory proposals -------------------------------------------

# Distinct tokens: the request's own text offers nothing after the root 2. The memory offers
# "0 3 5 2" -> 7 6 1 and "3 5 2" -> 5 4 0, and every earlier sample's output after "2".
MEMORY_PROMPT = torch.tensor([1, 4, 6, 0, 3, 5, 2])
MEMORY_STREAMS = ([0, 3, 5, 2, 7, 6, 1], [3, 5, 2, 5, 4, 0])


@pytest.mark.parametrize("temperature, top_p", [(0.6, 1.0), (1.0, 1.0), (1.0, 0.8)])
def test_first_two_tokens_follow_the_target_with_memory(temperature, top_p):
    """As test_ngram's chi-square, every proposal from memory (which also fills with the
    earlier samples' outputs, as on a server)."""
    from test_engine_exactness import ALPHA, SAMPLES, TREE, VOCAB, chi_square_pvalue, exact_joint

    target = tiny_model("qwen2", vocab_size=VOCAB, seed=21, hidden_size=16, num_layers=1, scale=3.0)
    alone = Engine(target, None, TREE, drafter=NgramDrafter())
    assert alone.generate(MEMORY_PROMPT, 1, seed=0, stop_on_eos=False).stats.tree_nodes == 0
    memory = NgramMemory()
    for stream in MEMORY_STREAMS:
        memory.add(stream)
    engine = Engine(target, None, TREE, drafter=NgramDrafter(memory=memory))
    counts = np.zeros(VOCAB * VOCAB)
    gained = 0
    for seed in range(SAMPLES):
        result = engine.generate(MEMORY_PROMPT, 2, temperature=temperature, top_p=top_p,
                                 seed=seed, stop_on_eos=False)
        assert result.stats.tree_nodes >= 2                # memory siblings were proposed
        counts[result.tokens[0] * VOCAB + result.tokens[1]] += 1
        gained += result.accepted[0] > 1
    assert len(memory) > len(MEMORY_STREAMS)               # the outputs were stored
    assert gained > SAMPLES * 0.1, "memory proposals were never accepted: the test would not bite"
    pvalue = chi_square_pvalue(counts, exact_joint(target, temperature, top_p, MEMORY_PROMPT))
    assert pvalue > ALPHA, f"memory T={temperature} top_p={top_p}: p-value {pvalue:.2e}"


# -- (e) greedy equality on both backends -----------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_with_memory_equals_autoregressive_transformers(arch):
    """The same random prompt twice (the same file edited again): the second request drafts
    the first one's output from memory, and both equal plain greedy decoding."""
    target = tiny_model(arch, vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    memory = NgramMemory()
    engine = Engine(target, None, WIDE_DEEP, drafter=NgramDrafter(memory=memory))
    plain = Engine(target, None, WIDE_DEEP, drafter=NgramDrafter())
    for seed in range(3):
        prompt = torch.randint(2, 96, (12,), generator=torch.Generator().manual_seed(seed))
        reference = engine.generate(prompt, 40, method="autoregressive", stop_on_eos=False)
        without = plain.generate(prompt, 40, method="sequoia", stop_on_eos=False)
        first = engine.generate(prompt, 40, method="sequoia", stop_on_eos=False)
        again = engine.generate(prompt, 40, method="sequoia", stop_on_eos=False)
        assert first.tokens == again.tokens == reference.tokens, (arch, seed)
        assert again.stats.draft_forwards == 0
        assert again.tokens_per_step > max(2.0, without.tokens_per_step), (arch, seed)


def test_greedy_with_memory_equals_autoregressive_llamacpp(tiny_gguf_pair):
    """test_ngram's llama.cpp setup (prompts without near-ties), each prompt run twice."""
    pytest.importorskip("llama_cpp")
    from redwood.backends.llamacpp import LlamaCppBackend
    from test_ngram import LLAMA_PROMPTS, assert_no_near_tie

    options = dict(n_ctx=512, n_seq_max=16, n_batch=64, n_threads=1)
    with LlamaCppBackend(tiny_gguf_pair[0], **options) as target, \
            LlamaCppBackend(tiny_gguf_pair[0], **options) as fresh:
        memory = NgramMemory()
        engine = Engine(target, None, WIDE_DEEP, drafter=NgramDrafter(memory=memory))
        for prompt in LLAMA_PROMPTS:
            reference = engine.generate(torch.tensor(prompt), 32, method="autoregressive",
                                        stop_on_eos=False)
            assert_no_near_tie(fresh, prompt, reference.tokens)
            for _ in range(2):
                result = engine.generate(torch.tensor(prompt), 32, method="sequoia",
                                         stop_on_eos=False)
                assert result.tokens == reference.tokens, prompt
            assert result.tokens_per_step > 2.0, prompt       # the repeat drafted from memory


def test_the_engine_stores_each_answer_and_honours_the_request_opt_out(tiny_gguf_pair):
    """Engine requests end with the drafter's finish(): the answer is in the memory before the
    next request starts; ngram_memory=False neither drafts from it nor adds to it."""
    pytest.importorskip("llama_cpp")
    from redwood.backends.llamacpp import LlamaCppBackend
    from test_ngram import LLAMA_PROMPTS

    with LlamaCppBackend(tiny_gguf_pair[0], n_ctx=512, n_seq_max=16, n_batch=64,
                         n_threads=1) as target:
        memory = NgramMemory()
        engine = Engine(target, None, WIDE_DEEP, drafter=NgramDrafter(memory=memory))
        prompt = LLAMA_PROMPTS[0]
        first = engine.generate(torch.tensor(prompt), 32, stop_on_eos=False)
        assert len(memory) == 1 and memory.tokens == 31     # all but the last (uncommitted)
        private = engine.generate(torch.tensor(prompt), 32, stop_on_eos=False, ngram_memory=False)
        assert private.tokens == first.tokens and len(memory) == 1
        assert private.tokens_per_step <= first.tokens_per_step + 1e-9   # no drafts from memory
        again = engine.generate(torch.tensor(prompt), 32, stop_on_eos=False)
        assert again.tokens == first.tokens and again.tokens_per_step > 2.0
        assert len(memory) == 2
