"""Requests pooled by prompt kind (decode/ngram_acceptance.py, LONG_PROMPT): what long-prompt
requests (edits copying their file) teach must not be what a short-prompt request (a chat
question) drafts on, and the learnt-rates file keeps the pools apart."""
from __future__ import annotations

import pytest
import torch
from test_learned_rates import learning  # noqa: F401  (fixture)
from test_ngram_shadow import copy_steps

from redwood.decode.ngram_acceptance import (LONG_PROMPT, MATCH_BUCKETS, AcceptanceModel,
                                              prompt_kind)
from redwood.decode.ngram_drafter import NgramDrafter
from redwood.measure.ngram_calibration import acceptance_model

LONG = list(range(1000, 1000 + LONG_PROMPT + 40))        # a file to edit
SHORT = list(range(2000, 2040))                          # a question


def edit_request(model: AcceptanceModel) -> None:
    """A long-prompt greedy request whose answer copies 120 tokens of its prompt."""
    copy_steps(NgramDrafter(model=model), LONG, LONG[10:130])


def test_the_kind_is_the_prompt_length():
    assert [prompt_kind(n) for n in (0, 1, LONG_PROMPT - 1, LONG_PROMPT, 5000)] == \
        [0, 0, 0, 1, 1]


def test_long_prompt_requests_teach_only_their_own_pool():
    model = AcceptanceModel(prior_rank1=(0.6,) * MATCH_BUCKETS, by_prompt=True)
    for _ in range(3):
        edit_request(model)
    long_pool = model.kind_pool(1)
    assert long_pool.counts and long_pool.drafts
    assert model.counts == {} and model.drafts == {}
    key = max(long_pool.counts, key=lambda k: long_pool.counts[k][1])
    assert long_pool.rate(key) > 0.9                     # the copies kept every node
    chat = NgramDrafter(model=model)
    chat.prefill(torch.tensor(SHORT))
    assert chat.estimates.model is model.kind_pool(0)
    assert chat.estimates.rate(key) == pytest.approx(0.6)   # the prior, not the edits'
    assert chat.estimates.draft_ratio(True, 20.0) == pytest.approx(1.0)


def test_one_pool_when_not_asked_to_split():
    model = AcceptanceModel(prior_rank1=(0.6,) * MATCH_BUCKETS)
    edit_request(model)
    chat = NgramDrafter(model=model)
    chat.prefill(torch.tensor(SHORT))
    key = max(model.counts, key=lambda k: model.counts[k][1])
    assert model.by_kind == {} and chat.estimates.model is model
    assert chat.estimates.rate(key) > 0.8


def test_each_pool_is_kept_between_processes(learning):  # noqa: F811
    first = acceptance_model(None, learned=True)
    edit_request(first)
    copy_steps(NgramDrafter(model=first), SHORT, SHORT[5:30])
    second = acceptance_model(None, learned=True)
    for kind in (0, 1):
        assert second.kind_pool(kind).counts == first.kind_pool(kind).counts != {}
        assert second.kind_pool(kind).drafts == first.kind_pool(kind).drafts
    assert second.kind_pool(0).counts != second.kind_pool(1).counts
