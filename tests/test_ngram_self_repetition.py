"""An answer repeating itself is told from an answer copying its prompt: continuations whose
every occurrence lies in the generated text are `own`, their long matches fall in the
"self-8+" bucket, with priors of their own (decode/ngram_acceptance.py)."""
from __future__ import annotations

import torch

from redwood.decode.ngram_acceptance import (MATCH_LABELS, PRIOR_RANK1, PRIOR_SELF_SAMPLED,
                                              SELF_BUCKET, AcceptanceModel, node_bucket)
from redwood.decode.ngram_drafter import NgramDrafter
from redwood.decode.ngram_index import Continuation, NgramIndex
from redwood.decode.ngram_memory import merge_continuations
from redwood.decode.ngram_trie import build_trie
from redwood.decode.ngram_trees import ngram_budget_tree, tree_limits

SPAN = list(range(100, 112))          # 12 tokens: a match of 8+ once repeated
LIMITS = tree_limits(ngram_budget_tree(depth=16))


def index_over(prompt, answer):
    index = NgramIndex(1, 6, 8)
    index.extend(prompt)
    index.prompt_end = len(prompt)
    index.extend(answer)
    return index


def test_a_repeat_within_the_answer_is_own_and_one_from_the_prompt_is_not():
    own = index_over([1, 2, 3], SPAN + [7] + SPAN[:10]).candidates(4, 4)[0]
    assert own.match == 10 and own.tokens == (110, 111, 7, 100) and own.own
    copied = index_over(SPAN + [7], SPAN[:10]).candidates(4, 4)[0]
    assert copied.match == 10 and not copied.own
    # the same continuation after the prompt and in the answer: the prompt speaks for it
    both = index_over(SPAN + [7], SPAN + [7] + SPAN[:10]).candidates(4, 4)[0]
    assert both.count == 2 and not both.own
    # no prompt end known (an index nobody told): nothing is own
    plain = NgramIndex(1, 6, 8)
    plain.extend([1, 2, 3] + SPAN + [7] + SPAN[:10])
    assert not plain.candidates(4, 4)[0].own


def test_own_reaches_every_node_of_a_lazy_chain_and_long_matches_only_are_self():
    long_own = Continuation(tuple(range(50, 60)), match=9, count=1, last=5, own=True)
    trie = build_trie(1, [long_own], lazy=True)
    at, buckets = 0, []
    while trie[at].children:                 # grows the lazy chain node by node
        at = trie[at].children[0]
        buckets.append(node_bucket(trie[at]))
    assert len(buckets) == 10 and set(buckets) == {SELF_BUCKET}
    assert MATCH_LABELS[SELF_BUCKET] == "self-8+"
    short_own = Continuation((50, 51), match=7, count=1, last=5, own=True)
    assert MATCH_LABELS[node_bucket(build_trie(1, [short_own])[1])] == "4-7"
    long_copy = Continuation((50, 51), match=9, count=1, last=5)
    assert MATCH_LABELS[node_bucket(build_trie(1, [long_copy])[1])] == "8-15"
    near_own = Continuation((50, 51), match=3, count=1, last=5, near=True, own=True)
    assert MATCH_LABELS[node_bucket(build_trie(1, [near_own])[1])] == "near"


def test_a_memory_hit_of_the_same_continuation_makes_it_not_own():
    ours = [Continuation((5, 6), match=9, count=1, last=30, own=True)]
    theirs = [Continuation((5, 6), match=9, count=2, last=-4)]
    merged = merge_continuations(ours, theirs, 4)
    assert merged[0].count == 3 and not merged[0].own
    assert merge_continuations(ours, [], 4)[0].own


def test_self_repetition_priors_greedy_and_sampled():
    model = AcceptanceModel()
    greedy_key, sampled_key = (True, SELF_BUCKET, 0, False), (False, SELF_BUCKET, 0, False)
    assert model.prior(greedy_key) == PRIOR_RANK1[SELF_BUCKET] == 0.9
    assert model.prior(sampled_key) == PRIOR_SELF_SAMPLED == 0.75
    assert model.prior((False, SELF_BUCKET, 0, True)) == 0.75 * model.prior_later
    # other buckets keep one prior for both kinds
    assert model.prior((False, 4, 0, False)) == model.prior((True, 4, 0, False))
    assert AcceptanceModel(prior_self_sampled=None).prior(sampled_key) == 0.9
    # a calibration that measured the key wins over both guesses
    measured = AcceptanceModel(calibration={sampled_key: [6.0, 10.0]})
    assert measured.prior(sampled_key) == 0.6


def test_the_drafter_rates_its_own_repetition_on_the_self_bucket_and_learns_it():
    """prefill marks where the answer starts; once the answer repeats a 12-token span of its
    own, the lookup's chain is self-8+ and its walk along the text teaches that key."""
    drafter = NgramDrafter(target_ms=None, max_length=16)
    drafter.prefill(torch.tensor([1, 2, 3]))
    assert drafter.index.prompt_end == 3
    text = SPAN + [7] + SPAN
    buckets = []
    for i, token in enumerate(text):
        trie, taken, _ = drafter.lookup(token, LIMITS, greedy=True)
        if i == len(SPAN) + 9:               # "7" and 9 tokens of the span again: match 10
            buckets = {MATCH_LABELS[node_bucket(trie[u])] for u in taken}
        drafter.commit_tokens([])
    assert buckets == {"self-8+"}
    accepted, trials = drafter.model.counts[(True, SELF_BUCKET, 0, False)]
    assert trials >= 1 and accepted == trials
    # the same text copied from the prompt instead is not self
    copying = NgramDrafter(target_ms=None, max_length=16)
    copying.prefill(torch.tensor(SPAN + [7]))
    for token in SPAN[:10]:
        trie, taken, _ = copying.lookup(token, LIMITS, greedy=True)
        copying.commit_tokens([])
    assert {MATCH_LABELS[node_bucket(trie[u])] for u in taken} == {"8-15"}
