"""The n-gram drafter (decode/ngram_index.py, decode/ngram_drafter.py): the incremental index
equals a brute-force scan, the cost model sizes proposals, learning, edge cases, and the engine
with it stays exact (greedy equality on both backends, chi-square of sampling)."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from redwood.decode.drafter import ChildChooser
from redwood.decode.engine import Engine
from redwood.decode.layout import TreeLayout
from redwood.decode.ngram_acceptance import (MATCH_BUCKETS, MATCH_LABELS, AcceptanceModel,
                                              node_bucket)
from redwood.decode.ngram_drafter import DRAFT_MARGIN, NgramDrafter
from redwood.decode.ngram_index import NEAR_BONUS, Continuation, NgramIndex
from redwood.decode.ngram_trie import TrieNode, build_trie
from redwood.errors import RedwoodError
from redwood.plan.tree import Tree, chain, star
from tiny import tiny_model
from tiny_gguf import tiny_gguf_pair  # noqa: F401  (session fixture)

WIDE_DEEP = Tree([-1, 0, 0, 0, 1, 1, 2, 4, 4, 7, 9, 10])
GREEDY = ChildChooser(True)


def layout(tree: Tree) -> TreeLayout:
    return TreeLayout.build(tree, "cpu")


# -- (a) the incremental index equals a brute-force scan ----------------------------------

def longest_common_suffix(a, b, limit):
    """The number of equal tokens at the ends of lists a and b, at most limit."""
    m = 0
    while m < min(len(a), len(b), limit) and a[len(a) - 1 - m] == b[len(b) - 1 - m]:
        m += 1
    return m


def brute_candidates(tokens, min_n, max_n, max_occurrences, max_continuations, max_length,
                     max_match=32, near=None, prompt_end=None):
    """The definition of NgramIndex.candidates, by scanning the whole stream: occurrences
    chosen by n-gram (max_n down to min_n, the most recent first, plus every one ending in
    the `near` window), each one's match the common suffix of the text before it and the
    text, capped at max_match; ranked by match (+ NEAR_BONUS when near), near, count, recency."""
    last = len(tokens) - 1
    taken: dict[int, int] = {}                       # end position -> match length
    for n in range(max_n, min_n - 1, -1):
        if n > len(tokens):
            continue
        suffix = tokens[len(tokens) - n:]
        ends = [e for e in range(n - 1, last) if tokens[e - n + 1:e + 1] == suffix]
        windowed = [e for e in ends if near and near[0] <= e <= near[1]]
        for e in ends[-max_occurrences:] + windowed:
            taken.setdefault(e, longest_common_suffix(tokens[:e + 1], tokens, max_match))
    groups: dict[tuple, list] = {}
    for e, m in taken.items():
        follow = tuple(tokens[e + 1:e + 1 + max_length])
        is_near = bool(near) and near[0] <= e <= near[1]
        own = prompt_end is not None and e >= prompt_end
        match, count, recent, was_near, was_own = groups.get(follow, (0, 0, -1, False, True))
        groups[follow] = [max(match, m), count + 1, max(recent, e), was_near or is_near,
                          was_own and own]
    ranked = sorted(groups.items(), key=lambda kv: (-(kv[1][0] + NEAR_BONUS * kv[1][3]),
                                                    not kv[1][3], -kv[1][1], -kv[1][2]))
    return [Continuation(follow, *stats[:4], own=stats[4])
            for follow, stats in ranked[:max_continuations]]


@settings(max_examples=150, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), max_size=40), min_n=st.integers(1, 3),
       extra=st.integers(0, 3), occurrences=st.integers(1, 5),
       continuations=st.integers(1, 6), length=st.integers(1, 6), longer=st.integers(0, 12),
       near=st.one_of(st.none(), st.tuples(st.integers(0, 40), st.integers(0, 8))),
       prompt_end=st.one_of(st.none(), st.integers(0, 40)))
def test_incremental_index_equals_brute_force(tokens, min_n, extra, occurrences, continuations,
                                              length, longer, near, prompt_end):
    """Including a `near` window (lo, lo + width): its occurrences are considered however
    old, and rank as NEAR_BONUS tokens longer; and a prompt end, after which a continuation
    all of whose occurrences lie is the answer's own."""
    max_n = min_n + extra
    index = NgramIndex(min_n, max_n, occurrences, max_match=max_n + longer)
    index.prompt_end = prompt_end
    window = None if near is None else (near[0], near[0] + near[1])
    for i, token in enumerate(tokens):
        index.append(token)
        expected = brute_candidates(tokens[:i + 1], min_n, max_n, occurrences,
                                    continuations, length, max_n + longer, window, prompt_end)
        assert index.candidates(continuations, length, window) == expected


def test_occurrences_are_reused_only_for_the_same_length_and_window():
    """The copy tracker and the lookup ask for the same suffix's occurrences in one step
    (one scan); another window or a longer text scans again."""
    tokens = [1, 2, 3, 9, 1, 2, 3, 8, 5, 1, 2, 3, 7, 1, 2, 3]
    index = NgramIndex(1, 3, 1)
    index.extend(tokens)
    first = index.occurrences()
    assert index.occurrences() is first
    assert index.candidates(4, 2, (2, 3)) == brute_candidates(tokens, 1, 3, 1, 4, 2, near=(2, 3))
    assert index.candidates(4, 2) == brute_candidates(tokens, 1, 3, 1, 4, 2)
    index.append(9)
    assert index.candidates(4, 2) == brute_candidates(tokens + [9], 1, 3, 1, 4, 2)


def test_match_lengths_extend_past_the_indexed_ngrams():
    """A 20-token repeat is a 20-token match although only 6-grams are indexed."""
    text = list(range(10, 30)) + [7] + list(range(10, 30))
    index = NgramIndex(1, 6, 8)
    index.extend(text)
    best = index.candidates(4, 4)[0]
    assert best.match == 20 and best.tokens == (7, 10, 11, 12)
    with pytest.raises(ValueError, match="max_match"):
        NgramIndex(1, 6, 8, max_match=5)


def test_trie_merges_shared_prefixes_in_rank_order():
    ranked = [Continuation((4, 5, 6), 3, 1, 9), Continuation((4, 7), 2, 2, 5),
              Continuation((8,), 2, 1, 3), Continuation((4, 5), 1, 1, 1)]
    trie = build_trie(1, ranked)
    assert [node.token for node in trie] == [1, 4, 5, 6, 7, 8]
    assert trie[0].children == [1, 5] and trie[1].children == [2, 4]
    assert [(node.depth, node.rank, node.match) for node in trie[1:]] == [
        (1, 1, 3), (2, 1, 3), (3, 1, 3), (2, 2, 2), (1, 2, 2)]


# -- (b) edge cases and a long prompt -------------------------------------------------------

def root_alone(proposal, root):
    return proposal.tokens.tolist() == [root] and proposal.layout.tree.parents == [-1]


def test_empty_and_single_token_prompts():
    drafter = NgramDrafter()
    drafter.prefill(torch.tensor([], dtype=torch.long))
    assert root_alone(drafter.propose(3, layout(WIDE_DEEP), GREEDY), 3)
    drafter.prefill(torch.tensor([5]))
    assert root_alone(drafter.propose(6, layout(WIDE_DEEP), GREEDY), 6)
    drafter.prefill(torch.tensor([5]))                 # "5 5": the suffix "5" was followed by 5
    proposal = drafter.propose(5, layout(WIDE_DEEP), GREEDY)
    assert proposal.tokens.tolist() == [5, 5] and proposal.point_mass.tolist() == [False, True]


def test_no_repeats_gives_the_root_alone():
    drafter = NgramDrafter()
    drafter.prefill(torch.arange(2, 50))
    proposal = drafter.propose(50, layout(WIDE_DEEP), GREEDY)
    assert root_alone(proposal, 50)
    assert proposal.draft_probs is None and proposal.draft_forwards == 0


def test_long_prompt_stays_cheap():
    """8k tokens of low-entropy text: the index holds one entry per n-gram (linear in the
    length) and each lookup considers at most max_occurrences occurrences per n."""
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 50, (8192,), generator=generator)
    drafter = NgramDrafter(min_n=1, max_n=4, max_occurrences=16)
    start = time.perf_counter()
    drafter.prefill(prompt)
    prefill_seconds = time.perf_counter() - start
    index = drafter.index
    assert index.entries == sum(len(prompt) - n + 1 for n in range(1, 5))
    start = time.perf_counter()
    root = 7
    for _ in range(50):
        proposal = drafter.propose(root, layout(WIDE_DEEP), GREEDY)
        assert len(index.occurrences()) <= 16 * 4
        drafter.commit([0], proposal.tokens)
        root = (root * 13 + 5) % 50
    print(f"8k prompt: prefill {prefill_seconds * 1e3:.0f} ms, 50 proposes "
          f"{(time.perf_counter() - start) * 1e3:.0f} ms")
    assert index.entries == sum(len(prompt) + 50 - n + 1 for n in range(1, 5))


# -- the cost model, limits, learning --------------------------------------------------------

STEEP = {1: 10.0, 2: 15.0, 3: 19.0, 4: 22.0, 6: 28.0, 8: 33.0, 12: 45.0}


def drafter_with(first: float, target_ms=STEEP, **options) -> NgramDrafter:
    """Every node's prior conditional acceptance is `first` (rank 1) / first/2 (later)."""
    model = AcceptanceModel(prior_rank1=(first,) * MATCH_BUCKETS, prior_later=0.5)
    return NgramDrafter(target_ms=target_ms, model=model, **options)


def propose_after(drafter, text, root, tree=WIDE_DEEP, **options):
    drafter.prefill(torch.tensor(text))
    return drafter.propose(root, layout(tree), GREEDY, **options)


REPEATED = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2]


def test_a_tree_must_beat_plain_by_the_margin():
    # One node at c: E(2) / t(2) = (1 + c) / 15 against 1 / 10 for a plain step. c = 0.55 is
    # 3 % faster on paper, inside DRAFT_MARGIN (10 %): plain. c = 0.7 is 13 % faster: drafted.
    one_node = chain(2)
    assert DRAFT_MARGIN == 0.1
    assert root_alone(propose_after(drafter_with(0.55), REPEATED, 3, one_node), 3)
    assert propose_after(drafter_with(0.7), REPEATED, 3, one_node).tokens.tolist() == [3, 4]
    assert propose_after(drafter_with(0.55, margin=0.02), REPEATED, 3,
                         one_node).tokens.tolist() == [3, 4]
    with pytest.raises(RedwoodError, match="margin"):
        NgramDrafter(target_ms=STEEP, margin=-0.1)


def test_cost_model_sizes_the_proposal():
    # t(2) = 1.5 t(1): one node pays only if it is accepted more than half the time.
    assert root_alone(propose_after(drafter_with(0.45, margin=0), REPEATED, 3), 3)
    assert propose_after(drafter_with(0.55, margin=0), REPEATED, 3).tokens.tolist()[:2] == [3, 4]
    # E(n)/t(n) with c = 0.9 on a chain of 8 (values 0.9, 0.81, ...): the best measured n <= 9.
    rates = {n: (1 + sum(0.9 ** k for k in range(1, n))) / t for n, t in STEEP.items() if n <= 9}
    proposal = propose_after(drafter_with(0.9), REPEATED, 3, chain(12))
    assert len(proposal.tokens) == max(rates, key=rates.get) == 8
    assert proposal.tokens.tolist() == [3, 4, 5, 6, 7, 8, 1, 2]
    # Flat cost (no profile): the whole useful trie, up to the engine's tree budget.
    assert len(propose_after(drafter_with(0.3, None), REPEATED, 3).tokens) == 7


def test_proposals_are_counted_by_match_length():
    """match_counts: every proposed node under its match length, accepted when on the path
    the target kept; a new request starts from zero."""
    drafter = drafter_with(0.9)
    proposal = propose_after(drafter, REPEATED, 3, chain(12))      # suffix 1 2 3: match 11
    tokens = proposal.tokens.tolist()
    assert tokens == [3, 4, 5, 6, 7, 8, 1, 2]
    drafter.commit([0, 1, 2, 3], proposal.tokens)                   # kept 4 5 6, rejected 7
    assert drafter.match_counts == {"8-15": [3, 7]}
    drafter.propose(9, layout(WIDE_DEEP), GREEDY)                   # no match: nothing proposed
    drafter.commit([0], torch.tensor([9]))
    assert drafter.match_counts == {"8-15": [3, 7]}
    drafter.prefill(torch.tensor(REPEATED))
    assert drafter.match_counts == {}


def test_proposal_stays_within_the_requested_tree():
    text = [9, 1, 2, 9, 3, 4, 9, 5, 6, 9, 7, 8]               # 9 was followed by 1, 3, 5, 7
    wide = propose_after(drafter_with(0.9, None), text, 9, star(8))
    assert sorted(wide.tokens.tolist()[1:]) == [1, 3, 5, 7]   # siblings, all depth 1
    assert wide.layout.tree.parents == [-1, 0, 0, 0, 0]
    narrow = propose_after(drafter_with(0.9, None), text, 9, chain(3))
    assert narrow.layout.tree.parents == [-1, 0, 1]           # one leaf, two edges
    small = propose_after(drafter_with(0.9, None), text, 9, Tree([-1, 0, 0, 1]))
    tree = small.layout.tree
    assert len(tree) <= 4 and tree.num_levels <= 3 and sum(not c for c in tree.children) <= 2


def test_min_confidence_drops_unlikely_nodes():
    text = [9, 1, 2, 9, 3, 4]
    full = propose_after(drafter_with(0.6, None), text, 9, star(4))
    assert len(full.tokens) == 3                                 # 1 and 3 (rank 2 at 0.3)
    pruned = propose_after(drafter_with(0.6, None), text, 9, star(4), min_confidence=0.5)
    assert len(pruned.tokens) == 2                               # rank 2 (0.3) dropped


@pytest.mark.parametrize("emitted, drafts_after", [(9, False), (4, True)])
def test_learns_from_the_emitted_text_even_without_drafting(emitted, drafts_after):
    """After the root 6 the text offers 4 (prior 0.45: too weak to pay on STEEP, so nothing is
    proposed). The token emitted next is observed all the same: never 4 -> the rate falls;
    always 4 -> it rises and the drafter starts proposing."""
    text, key = torch.tensor([4, 5, 6, 4, 5, 6, 4, 5]), (True, 3, 0, False)   # match 4+, depth 1
    drafter = drafter_with(0.45, margin=0)
    for step in range(5):
        drafter.prefill(text)
        proposal = drafter.propose(6, layout(WIDE_DEEP), GREEDY)
        assert root_alone(proposal, 6) == (step == 0 or not drafts_after)
        drafter.commit([0], proposal.tokens)
        drafter.commit([0], drafter.propose(emitted, layout(WIDE_DEEP), GREEDY).tokens)
    hits = 5.0 if drafts_after else 0.0
    assert drafter.model.counts[key] == [hits, 5.0]
    assert drafter.model.rate(key) == pytest.approx((hits + 0.45 * 4) / 9)


def copy_sizes(drafter, steps: int = 40) -> list[int]:
    """Tree sizes a greedy drafter proposes while the target copies a 40-token text verbatim
    again and again (every proposed token is kept, the bonus is the next one)."""
    text = list(range(100, 140))
    truth = text * 40
    drafter.prefill(torch.tensor(text))
    position, sizes = len(text), []
    for _ in range(steps):
        proposal = drafter.propose(truth[position], layout(chain(32)), GREEDY)
        tokens = proposal.tokens.tolist()
        kept = 1
        while kept < len(tokens) and tokens[kept] == truth[position + kept]:
            kept += 1
        drafter.commit(list(range(kept)), proposal.tokens)
        sizes.append(len(tokens))
        position += kept
    return sizes


def test_deep_nodes_are_learnt_while_only_short_chains_are_drafted(monkeypatch):
    """Every rate starts at 0.9, so on these costs a 4-node chain pays best (3.44 / 22 against
    9.66 / 100 for 32 nodes). A 4-node step emits 4 tokens, so walking only the last step's
    trie observes depths 1-4 and never 5+: those stay at 0.9 and the drafter stays at 4 nodes
    on a verbatim copy. Walking earlier tries on along the text observes the deep nodes too,
    their rates rise towards 1, and the drafter moves to 32-node chains (32 / 100 > 4 / 22)."""
    costs = {1: 10.0, 4: 22.0, 32: 100.0}
    sizes = copy_sizes(drafter_with(0.9, costs, max_length=32))
    assert sizes[0] == 4 and sizes[-5:] == [32] * 5
    monkeypatch.setattr("redwood.decode.ngram_drafter.MAX_WALKS", 1)    # the last trie only
    assert set(copy_sizes(drafter_with(0.9, costs, max_length=32))) == {4}


def test_propose_twice_without_commit_is_refused():
    drafter = NgramDrafter()
    drafter.prefill(torch.tensor([1, 2, 1]))
    drafter.propose(2, layout(WIDE_DEEP), GREEDY)
    with pytest.raises(RedwoodError, match="without commit"):
        drafter.propose(2, layout(WIDE_DEEP), GREEDY)


def test_bad_profile_is_refused():
    with pytest.raises(RedwoodError, match="n = 1"):
        NgramDrafter(target_ms={2: 10.0})


# -- (c) greedy equality on both backends -----------------------------------------------------

def repeated_prompt(seed: int, vocab: int, low: int = 2) -> torch.Tensor:
    """A span, three other tokens, the span again, then its first three tokens."""
    generator = torch.Generator().manual_seed(seed)
    span = torch.randint(low, vocab, (6,), generator=generator)
    other = torch.randint(low, vocab, (3,), generator=generator)
    return torch.cat([span, other, span, span[:3]])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_equals_autoregressive_transformers(arch):
    target = tiny_model(arch, vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    engine = Engine(target, None, WIDE_DEEP, drafter=NgramDrafter())
    gains = []
    for seed in range(3):
        prompt = repeated_prompt(seed, 96)
        reference = engine.generate(prompt, 40, method="autoregressive", stop_on_eos=False)
        result = engine.generate(prompt, 40, method="sequoia", stop_on_eos=False)
        assert result.tokens == reference.tokens, (arch, seed)
        assert sum(result.accepted) == 40 and result.stats.draft_forwards == 0
        gains.append(result.tokens_per_step)
    assert max(gains) > 1.5, gains


# Prompts (built by repeated_prompt(seed, 256, 0) for seeds 1113, 1228, 1063, 1268) whose 32
# greedy tokens on the session's tiny GGUF target have a top-2 margin of at least 0.28, far above
# the batched/one-token kernel noise (test_llamacpp_backend.TOL); checked below.
LLAMA_PROMPTS = [
    [46, 37, 140, 229, 164, 215, 65, 174, 254, 46, 37, 140, 229, 164, 215, 46, 37, 140],
    [114, 66, 64, 15, 224, 92, 134, 147, 104, 114, 66, 64, 15, 224, 92, 114, 66, 64],
    [141, 223, 181, 40, 252, 210, 129, 241, 123, 141, 223, 181, 40, 252, 210, 141, 223, 181],
    [62, 52, 34, 236, 154, 190, 61, 100, 133, 62, 52, 34, 236, 154, 190, 62, 52, 34]]


def test_greedy_equals_autoregressive_llamacpp(tiny_gguf_pair):
    pytest.importorskip("llama_cpp")
    from redwood.backends.llamacpp import LlamaCppBackend

    options = dict(n_ctx=512, n_seq_max=16, n_batch=64, n_threads=1)
    with LlamaCppBackend(tiny_gguf_pair[0], **options) as target, \
            LlamaCppBackend(tiny_gguf_pair[0], **options) as fresh:
        engine = Engine(target, None, WIDE_DEEP, drafter=NgramDrafter())
        gains = []
        for prompt in LLAMA_PROMPTS:
            reference = engine.generate(torch.tensor(prompt), 32, method="autoregressive",
                                        stop_on_eos=False)
            assert_no_near_tie(fresh, prompt, reference.tokens)
            result = engine.generate(torch.tensor(prompt), 32, method="sequoia", stop_on_eos=False)
            assert result.tokens == reference.tokens, prompt
            gains.append(result.tokens_per_step)
    assert max(gains) > 1.5, gains


# -- (d) chi-square exactness with point-mass proposals ---------------------------------------

# "3 5 2" is followed by 5 then by 7 earlier: the drafter proposes the siblings 7 and 5 (each
# with its own continuation) below the root 2, point masses the target accepts ~1/6 of the time.
NGRAM_PROMPT = torch.tensor([3, 5, 2, 5, 4, 3, 5, 2, 7, 6, 3, 5, 2])


@pytest.mark.parametrize("temperature, top_p", [(0.6, 1.0), (1.0, 1.0), (1.0, 0.8)])
def test_first_two_tokens_follow_the_target(temperature, top_p):
    """~2 s each on 2 cores (a 1-layer model, two tokens per run). A first draft token is
    accepted in ~35-40% of the runs; a verifier that kept p after rejecting a point mass
    gave p-values below 1e-50 here."""
    from test_engine_exactness import ALPHA, SAMPLES, TREE, VOCAB, chi_square_pvalue, exact_joint

    target = tiny_model("qwen2", vocab_size=VOCAB, seed=21, hidden_size=16, num_layers=1, scale=3.0)
    drafter = NgramDrafter()
    engine = Engine(target, None, TREE, drafter=drafter)
    counts = np.zeros(VOCAB * VOCAB)
    gained = 0
    for seed in range(SAMPLES):
        result = engine.generate(NGRAM_PROMPT, 2, temperature=temperature, top_p=top_p, seed=seed,
                                 stop_on_eos=False)
        assert result.stats.tree_nodes >= 2                # siblings were really proposed
        counts[result.tokens[0] * VOCAB + result.tokens[1]] += 1
        gained += result.accepted[0] > 1
    assert gained > SAMPLES * 0.1, "point masses were never accepted: the test would not bite"
    pvalue = chi_square_pvalue(counts, exact_joint(target, temperature, top_p, NGRAM_PROMPT))
    assert pvalue > ALPHA, f"ngram T={temperature} top_p={top_p}: p-value {pvalue:.2e}"


def assert_no_near_tie(fresh, prompt, tokens, margin: float = 0.1):
    """Precondition of a greedy-equality test on llama.cpp: at no generated position are the
    target's top two logits within `margin` (kernels differ by batch shape, §5.3)."""
    fresh.reset()
    logits = fresh.append(prompt + tokens, rows=len(tokens) + 1)[:-1]
    top = logits.topk(2, dim=-1).values
    assert float((top[:, 0] - top[:, 1]).min()) > margin, f"near-tie in {prompt}"


def test_near_matches_of_one_token_are_a_bucket_of_their_own():
    """A one-token agreement where the copy was is told apart from a 2-7-token one (kept 0.44
    against 0.75-1.0 on chat in the replay); long near matches keep their length's bucket."""
    def label(match, near=False, edited=False):
        node = TrieNode(5, 0, 1, 1, match, near=near, edited=edited)
        return MATCH_LABELS[node_bucket(node)]
    assert [label(m, near=True) for m in (1, 2, 7, 8, 20)] == \
        ["near-1", "near", "near", "8-15", "16-31"]
    assert [label(m) for m in (1, 2, 3, 4, 8, 16, 32)] == \
        ["1", "2", "3", "4-7", "8-15", "16-31", "32+"]
    assert label(1, near=True, edited=True) == "edit"
    assert len(MATCH_LABELS) == MATCH_BUCKETS == len(AcceptanceModel().prior_rank1)


class OneKeyModel(AcceptanceModel):
    """Every node shares one key, so each rejection the text shows counts against it."""

    @staticmethod
    def key(greedy, node):
        return (True, 0, 0, False)


def rejected_steps(drafter, steps: int) -> list[bool]:
    """A request whose prompt pairs a -> a + 1000 (one continuation per root) while the text
    goes a, 7, a + 1, 7, ...: every proposal is rejected. Whether each step drafted."""
    prompt = [t for a in range(100, 100 + steps) for t in (a, a + 1000)]
    drafter.prefill(torch.tensor(prompt))
    drafted = []
    for a in range(100, 100 + steps):
        for root in (a, 7):
            proposal = drafter.propose(root, layout(chain(2)), GREEDY)
            if root == a:
                drafted.append(not root_alone(proposal, a))
            drafter.commit([0], proposal.tokens)
    return drafted


def test_a_request_that_keeps_rejecting_a_key_stops_drafting_on_it(monkeypatch):
    """The pooled model says 0.9 from 100,000 earlier observations (drafted on STEEP: c > 0.65).
    This request's text rejects every proposal: its own evidence (OWN_WEIGHT against the
    pooled rate) turns it plain within a few tens of steps, while the pooled rate alone barely
    moves; the next request starts again from the pooled rate."""
    model = OneKeyModel()
    model.counts[(True, 0, 0, False)] = [90000.0, 100000.0]
    drafter = NgramDrafter(target_ms=STEEP, model=model)
    drafted = rejected_steps(drafter, 60)
    assert drafted[0] and not any(drafted[-10:])
    assert model.rate((True, 0, 0, False)) > 0.88             # the pool still says draft
    assert rejected_steps(drafter, 1) == [True]               # a new request: drafted again
    monkeypatch.setattr("redwood.decode.ngram_acceptance.OWN_WEIGHT", 1e12)   # pooled rate only
    for weight in ("DRAFT_PRIOR_TOKENS", "DRAFT_OWN_TOKENS"):      # and no draft ratio
        monkeypatch.setattr(f"redwood.decode.ngram_acceptance.{weight}", 1e12)
    model.counts[(True, 0, 0, False)] = [90000.0, 100000.0]
    assert all(rejected_steps(NgramDrafter(target_ms=STEEP, model=model), 60))
