"""Incremental detokenisation (decode/detokenize.py): decoding a window per step gives exactly the
text of decoding every id so far, on the shipped (byte-level BPE) tokenizer, whatever the step
sizes, and falls back to a whole decode for a tokenizer whose text is not concatenative."""
from __future__ import annotations

import random

import pytest

from redwood.decode.detokenize import IncrementalText

TEXTS = ["naïve café 🦜🪿𓀀 ꙮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 done", "def f(x):\n    return x ** 2  # 平方\n",
         "Ünïcödé — “quotes” and emoji 🤖🧪 in a list:\n- one\n- two"]


@pytest.fixture(scope="module")
def tokenizer(shipped_tokenizer):
    return shipped_tokenizer


def decode(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def random_ids(tokenizer, rng: random.Random) -> list[int]:
    """Pieces of real text (characters split across tokens) mixed with random ids: ordinary
    tokens, special tokens and byte fragments that never complete a character."""
    ids: list[int] = []
    for _ in range(rng.randrange(1, 8)):
        kind = rng.random()
        if kind < 0.5:
            text = rng.choice(TEXTS)
            start = rng.randrange(len(text))
            ids += tokenizer(text[start:start + rng.randrange(1, 30)]).input_ids
        elif kind < 0.9:
            ids += [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 6))]
        else:
            ids += tokenizer.all_special_ids[:1]
    return ids


def feed(inc: IncrementalText, ids: list[int], rng: random.Random, check) -> str:
    """Feed ids in random step sizes (1-5, as speculative steps yield), checking the text after
    every step; returns everything emitted."""
    out, at = [], 0
    while at < len(ids):
        step = ids[at:at + rng.randrange(1, 6)]
        at += len(step)
        out.append(inc.add(step))
        check(inc, ids[:at])
    return "".join(out) + inc.finish()


def test_window_decoding_equals_decoding_everything(tokenizer):
    rng = random.Random(7)
    used_window = 0
    for _ in range(300):
        ids = random_ids(tokenizer, rng)
        inc = IncrementalText(tokenizer)

        def check(inc, so_far):
            assert inc.text == decode(tokenizer, so_far)

        assert feed(inc, ids, rng, check) == decode(tokenizer, ids)
        used_window += inc._context > 0
    assert used_window > 100              # the window really moved past the start


def test_emitted_text_never_ends_in_half_a_character(tokenizer):
    rng = random.Random(3)
    for text in TEXTS:
        ids = tokenizer(text).input_ids
        inc = IncrementalText(tokenizer)
        deltas = []
        at = 0
        while at < len(ids):
            n = rng.randrange(1, 4)
            deltas.append(inc.add(ids[at:at + n]))
            at += n
        deltas.append(inc.finish())
        assert all(not d.endswith("\ufffd") for d in deltas)
        assert "".join(deltas) == text


def test_stop_strings_with_window_decoding(tokenizer):
    rng = random.Random(11)
    text = "one two three four five six seven eight nine ten " * 20
    ids = tokenizer(text).input_ids
    inc = IncrementalText(tokenizer, stop=["nine ten one two three four five six seven eight"
                                           " nine ten one"])
    emitted = feed(inc, ids, rng, lambda inc, so_far: None)
    assert inc.stopped and emitted == "one two three four five six seven eight "
    assert inc.n_tokens < len(ids)


class CleaningTokenizer:
    """The shipped tokenizer with a cleanup across token boundaries (" ," -> ","), as
    tokenizers with clean_up_tokenization_spaces do: a window's text need not extend its
    context's ("a " then "a,")."""

    def __init__(self, inner):
        self.inner = inner

    def decode(self, ids, skip_special_tokens=True):
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens).replace(" ,", ",")


def test_a_tokenizer_that_cleans_across_tokens_falls_back_to_decoding_everything(tokenizer):
    """inc.text stays decode(ids so far) at every step. (What was emitted before a cleanup
    changed the text behind it cannot be taken back, with or without the window.)"""
    cleaning = CleaningTokenizer(tokenizer)
    ids = [t for word in ["a", " ", ",", " b", " ", ",", " c"] for t in tokenizer(word).input_ids]
    assert cleaning.decode(ids) != "".join(cleaning.decode([t]) for t in ids)   # not concatenative
    for seed in range(5):
        inc = IncrementalText(cleaning)

        def check(inc, so_far):
            assert inc.text == cleaning.decode(so_far)

        feed(inc, ids, random.Random(seed), check)
