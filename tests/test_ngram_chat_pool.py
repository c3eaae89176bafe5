"""Chat requests learn apart from raw completions (decode/ngram_acceptance.py, PROMPT_KINDS):
a short prompt that opens the assistant's turn of the chat template is a chat request, with
its own pool, kept apart in the learnt-rates file too."""
from __future__ import annotations

import pytest
import torch
from test_learned_rates import learning  # noqa: F401  (fixture)
from test_ngram_shadow import copy_steps

from redwood.decode.ngram_acceptance import (CHAT_KIND, LONG_KIND, LONG_PROMPT, MATCH_BUCKETS,
                                              SHORT_KIND, AcceptanceModel, chat_turn_opened,
                                              prompt_kind)
from redwood.decode.ngram_drafter import NgramDrafter
from redwood.measure.ngram_calibration import acceptance_model

TURN = (900, 901, 902)                                   # "<|im_start|>", "assistant", "\n"
QUESTION = list(range(2000, 2040)) + list(TURN)          # a chat question, its turn opened
COMPLETION = list(range(2000, 2040))                     # a function to complete
FILE = list(range(1000, 1000 + LONG_PROMPT + 40)) + list(TURN)   # a file to edit, in chat


def test_the_kind_is_length_then_format():
    assert [prompt_kind(n, chat) for n, chat in
            ((10, False), (10, True), (LONG_PROMPT, False), (LONG_PROMPT, True))] == \
        [SHORT_KIND, CHAT_KIND, LONG_KIND, LONG_KIND]


@pytest.mark.parametrize("prompt, opened", [
    (QUESTION, True),
    (QUESTION[:-1], True),              # the drafter is often given the prompt before its root
    (COMPLETION, False),
    (QUESTION[:-2], False),
    (list(TURN[1:]), False),            # part of the turn is not the turn
    ([], False),
])
def test_a_chat_turn_is_told_by_the_prompts_end(prompt, opened):
    assert chat_turn_opened(prompt, TURN) is opened
    assert chat_turn_opened(prompt, ()) is False                 # no template: never chat


def test_a_one_token_turn_needs_the_whole_turn():
    assert chat_turn_opened([5, 7], (7,)) and not chat_turn_opened([5, 6], (7,))


def _drafter_pool(model: AcceptanceModel, prompt: list[int]) -> AcceptanceModel:
    drafter = NgramDrafter(model=model)
    drafter.prefill(torch.tensor(prompt))
    return drafter.estimates.model


def test_each_request_learns_in_its_kind_of_pool():
    model = AcceptanceModel(by_prompt=True, chat_turn=TURN)
    assert _drafter_pool(model, QUESTION) is model.kind_pool(CHAT_KIND)
    assert _drafter_pool(model, QUESTION[:-1]) is model.kind_pool(CHAT_KIND)
    assert _drafter_pool(model, COMPLETION) is model.kind_pool(SHORT_KIND)
    assert _drafter_pool(model, FILE) is model.kind_pool(LONG_KIND)
    # without the template's turn a chat question is a short prompt like any other
    plain = AcceptanceModel(by_prompt=True)
    assert _drafter_pool(plain, QUESTION) is plain.kind_pool(SHORT_KIND)


def test_completions_do_not_teach_chat():
    model = AcceptanceModel(prior_rank1=(0.6,) * MATCH_BUCKETS, by_prompt=True, chat_turn=TURN)
    for _ in range(3):        # completions that copy their prompt (code restating itself)
        copy_steps(NgramDrafter(model=model), COMPLETION, COMPLETION[5:35])
    taught = model.kind_pool(SHORT_KIND)
    key = max(taught.counts, key=lambda k: taught.counts[k][1])
    assert taught.rate(key) > 0.8
    chat = NgramDrafter(model=model)
    chat.prefill(torch.tensor(QUESTION))
    assert chat.estimates.rate(key) == pytest.approx(0.6)        # the prior, not the code's
    assert model.kind_pool(CHAT_KIND).counts == {}


def test_the_chat_pool_is_kept_between_processes(learning):  # noqa: F811
    first = acceptance_model(None, learned=True, chat_turn=TURN)
    copy_steps(NgramDrafter(model=first), QUESTION, QUESTION[5:30])
    copy_steps(NgramDrafter(model=first), COMPLETION, COMPLETION[5:30])
    second = acceptance_model(None, learned=True, chat_turn=TURN)
    for kind in (SHORT_KIND, CHAT_KIND):
        assert second.kind_pool(kind).counts == first.kind_pool(kind).counts != {}


def test_the_shipped_tokenizers_turn_is_what_a_chat_prompt_ends_with(shipped_tokenizer):
    from redwood.prompts import assistant_turn_ids, encode_prompt

    turn = assistant_turn_ids(shipped_tokenizer)
    assert 1 <= len(turn) <= 8
    ids = encode_prompt(shipped_tokenizer, "Write a poem.", chat=True).tolist()
    raw = encode_prompt(shipped_tokenizer, "def add(a, b):", chat=False).tolist()
    assert chat_turn_opened(ids, turn) and not chat_turn_opened(raw, turn)
    assert shipped_tokenizer.decode(list(turn)).strip().endswith("assistant")


def test_a_tokenizer_without_a_template_has_no_turn():
    from redwood.prompts import assistant_turn_ids

    class NoTemplate:
        chat_template = None

    assert assistant_turn_ids(NoTemplate()) == ()
