"""The draft ratio: shadow trees resolved against the text (decode/ngram_shadow.py) and the
n-gram drafter's scaling of its predicted tokens by kept / predicted (decode/ngram_acceptance.py)."""
from __future__ import annotations

import pytest
import torch

from redwood.decode.drafter import ChildChooser
from redwood.decode.layout import TreeLayout
from redwood.decode.ngram_acceptance import (DRAFT_OWN_TOKENS, DRAFT_PRIOR_TOKENS, MATCH_BUCKETS,
                                              LONG_DRAFT_TOKENS, AcceptanceModel,
                                              RequestEstimates)
from redwood.decode.ngram_drafter import NgramDrafter
from redwood.decode.ngram_index import Continuation
from redwood.decode.ngram_trie import build_trie
from redwood.decode.ngram_shadow import ShadowDrafts
from redwood.plan.tree import chain

GREEDY = ChildChooser(greedy=True)
STEEP = {1: 10.0, 2: 15.0, 3: 19.0, 4: 22.0, 6: 28.0, 8: 33.0, 12: 45.0}


def pooled_kept(model: AcceptanceModel, share: float, predicted: float = 1000.0) -> None:
    """The pool has seen drafts of every class keep `share` of what they predicted."""
    for tree in (LONG_DRAFT_TOKENS / 2, LONG_DRAFT_TOKENS):
        for _ in range(int(predicted / tree)):
            model.observe_draft(True, tree, round(share * tree))


def recorder():
    seen = []
    return seen, lambda greedy, predicted, kept: seen.append((greedy, predicted, kept))


def two_branch_trie():
    """root 0 -> 10 -> 11 -> 12 (ids 1, 2, 3) and root -> 20 (id 4)."""
    return build_trie(0, [Continuation((10, 11, 12), 8, 1, 5), Continuation((20,), 1, 1, 3)])


def test_a_shadow_keeps_the_nodes_the_text_follows_and_resolves_where_it_leaves():
    seen, observe = recorder()
    shadows = ShadowDrafts(observe)
    trie = two_branch_trie()
    shadows.add(trie, True, [1, 2, 3], 2.5)
    shadows.follow([10])                       # one node kept, the shadow goes on
    assert seen == [] and len(shadows.pending) == 1
    shadows.follow([11, 99])                   # a second kept, then the text leaves it
    assert seen == [(True, 2.5, 2)] and shadows.pending == []


def test_a_shadow_followed_to_its_leaf_resolves_with_every_node_kept():
    seen, observe = recorder()
    shadows = ShadowDrafts(observe)
    shadows.add(two_branch_trie(), False, [1, 2], 1.7)     # 10 -> 11, not 12
    shadows.follow([10, 11])
    assert seen == [(False, 1.7, 2)]


def test_a_shadow_counts_only_its_own_nodes_and_a_plain_step_is_no_observation():
    seen, observe = recorder()
    shadows = ShadowDrafts(observe)
    trie = two_branch_trie()
    shadows.add(trie, True, [], 0.0)           # the unscaled choice was a plain step
    shadows.add(trie, True, [4], 0.4)          # only the 20 branch
    shadows.follow([10, 11, 12])               # the text takes the other branch
    assert seen == [(True, 0.4, 0)]


def test_the_draft_ratio_is_kept_over_predicted_with_pooled_and_own_priors():
    model = AcceptanceModel()
    assert model.draft_ratio(True, 100.0) == 1.0
    model.observe_draft(True, 100.0, 20)
    pooled = (20 + DRAFT_PRIOR_TOKENS) / (100 + DRAFT_PRIOR_TOKENS)
    assert model.draft_ratio(True, 100.0) == pytest.approx(pooled)
    assert model.draft_ratio(False, 100.0) == 1.0     # greedy and sampling are told apart
    assert model.draft_ratio(True, 2.0) == 1.0        # and long drafts from short ones
    request = RequestEstimates(model)
    assert request.draft_ratio(True, 50.0) == pytest.approx(pooled)
    request.observe_draft(True, 10.0, 10)      # this request keeps what it predicts
    pooled = (30 + DRAFT_PRIOR_TOKENS) / (110 + DRAFT_PRIOR_TOKENS)
    assert request.draft_ratio(True, 50.0) == pytest.approx(
        (10 + pooled * DRAFT_OWN_TOKENS) / (10 + DRAFT_OWN_TOKENS))
    model.observe_draft(True, 1e9, 0)
    assert model.draft_ratio(True, 1e9) == 0.05     # clamped (DRAFT_RATIO_RANGE)


def test_long_drafts_that_fail_do_not_hide_behind_short_ones_that_hold():
    """Chat at T 0.6, replayed: trees predicting 2-4 drafted tokens keep about that, the rare
    20+ chains of a list item repeating the one before keep 2-3. One ratio over both stays near
    1 and keeps drafting the long chains; the classes learn apart."""
    request = RequestEstimates(AcceptanceModel())
    for _ in range(30):
        request.observe_draft(True, 3.0, 3)
    for _ in range(3):
        request.observe_draft(True, 24.0, 3)
    assert request.draft_ratio(True, 3.0) > 0.95
    assert request.draft_ratio(True, 24.0) < 0.5     # one ratio over both would say 0.61


def copy_steps(drafter: NgramDrafter, prompt: list[int], text: list[int]) -> list[int]:
    """Decode `text` after `prompt` as a verifier would with a greedy target that says
    `text`: each step keeps the proposed path the text follows. The tree sizes, per step."""
    drafter.prefill(torch.tensor(prompt[:-1]))
    root, at, sizes = prompt[-1], 0, []
    tree = TreeLayout.build(chain(8), "cpu")
    while at < len(text):
        proposal = drafter.propose(root, tree, GREEDY)
        tokens = proposal.tokens.tolist()
        kept = 0
        while kept + 1 < len(tokens) and at + kept + 1 < len(text) and \
                tokens[kept + 1] == text[at + kept]:
            kept += 1
        drafter.commit(list(range(kept + 1)), proposal.tokens)
        sizes.append(len(tokens))
        at += kept + 1
        root = text[at - 1]
    drafter.finish()
    return sizes


def test_a_pessimistic_ratio_recovers_from_what_undrafted_steps_would_have_kept():
    """The pooled ratio says drafts keep 3 % of their prediction, so the first steps of a
    verbatim copy stay plain; the shadows of those plain steps show every node kept, the
    request's ratio rises, and it drafts long chains again (no exploration trap)."""
    model = AcceptanceModel(prior_rank1=(0.9,) * MATCH_BUCKETS)
    pooled_kept(model, 0.0, predicted=2000.0)
    classes = (0.0, LONG_DRAFT_TOKENS)
    before = [model.draft_ratio(True, predicted) for predicted in classes]
    copy = list(range(100, 160))
    sizes = copy_steps(NgramDrafter(target_ms=STEEP, model=model), copy + [7, 100],
                       copy[1:])
    assert sizes[:3] == [1, 1, 1]              # talked out of drafting at first
    assert max(sizes[-5:]) == 8                # and drafting the largest measured size again
    after = [model.draft_ratio(True, predicted) for predicted in classes]
    assert any(a > b for a, b in zip(after, before))       # the pool learnt it too


def test_over_predicted_chains_shrink_the_drafts_that_follow():
    """Every earlier occurrence of each token is followed by a 6-token run the text never
    repeats past its first token: the node estimates (prior 0.9) keep predicting long chains,
    the draft ratio learns they keep ~1 and sizes the trees down to plain steps."""
    prompt = [t for a in range(200, 240) for t in (a, a + 1000, a + 2000, a + 3000, a + 4000,
                                                     a + 5000, a + 6000)] + [7]
    text = [t for a in range(200, 240) for t in (a, a + 1000, 9)]
    calibrated = copy_steps(NgramDrafter(target_ms=STEEP, model=AcceptanceModel(
        prior_rank1=(0.9,) * MATCH_BUCKETS)), prompt, text)
    uncalibrated = copy_steps(NgramDrafter(target_ms=STEEP, model=AcceptanceModel(
        prior_rank1=(0.9,) * MATCH_BUCKETS), learn=False), prompt, text)
    assert sum(n > 1 for n in uncalibrated[-20:]) >= 10
    assert sum(n > 2 for n in calibrated[-20:]) == 0


def test_the_drafter_reports_the_ratio_it_would_apply():
    """None before its first lookup; then its request's ratio on the pool's, which a pool that
    learnt drafts keep a fifth of what they predict pulls below 1."""
    model = AcceptanceModel(prior_rank1=(0.9,) * MATCH_BUCKETS)
    pooled_kept(model, 0.2)
    drafter = NgramDrafter(target_ms=STEEP, model=model)
    assert drafter.draft_ratio() is None
    copy_steps(drafter, [5, 6, 7, 8, 5, 6], [7, 8, 9])
    assert drafter.draft_ratio() == pytest.approx(
        drafter.estimates.draft_ratio(True, drafter._scaled[1]))
    assert drafter.draft_ratio() < 0.5
    fixed = NgramDrafter(target_ms=STEEP, model=model, learn=False)
    copy_steps(fixed, [5, 6, 7, 8, 5, 6], [7, 8, 9])
    assert fixed.draft_ratio() is None             # no learning: no scale applied
