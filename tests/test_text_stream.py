"""A streamed request's text on its way to the client (serve/text_stream.py): the first text at
once, later text at most every `interval` (injected clock), the rest at the end; the text
posted is the text of every id; stop strings still end a request on the step that made them."""
from __future__ import annotations

import pytest

from redwood.serve.text_stream import TextStream

TEXT = "def area(r):\n    return 3.14159 * r * r  # πr² 🥧\n\nprint(area(2))\n"


@pytest.fixture(scope="module")
def tokenizer(shipped_tokenizer):
    return shipped_tokenizer


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CountingTokenizer:
    """The shipped tokenizer, counting decode calls."""

    def __init__(self, inner):
        self.inner, self.decodes = inner, 0

    def decode(self, ids, skip_special_tokens=True):
        self.decodes += 1
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def run(tokenizer, ids, interval, stop=(), live=True, step_s=0.035, per_step=1):
    """Feed `ids` per_step at a time, the clock moving step_s per step; returns (posts as
    (time, text), the TextStream)."""
    clock, posts = Clock(), []
    stream = TextStream(lambda kind, text: posts.append((clock.now, text)), tokenizer,
                        list(stop), live=live, interval=interval, clock=clock)
    for at in range(0, len(ids), per_step):
        if not stream.add(ids[at:at + per_step]):
            break
        clock.now += step_s
    stream.finish()
    return posts, stream


def test_first_text_at_once_then_at_most_every_interval(tokenizer):
    ids = tokenizer(TEXT).input_ids
    posts, stream = run(tokenizer, ids, interval=0.05)
    assert "".join(text for _, text in posts) == TEXT
    assert posts[0][0] == 0.0                           # the first step's text, at once
    times = [t for t, _ in posts[:-1]]                  # the last post is the finish
    assert all(b - a >= 0.05 - 1e-9 for a, b in zip(times, times[1:]))
    assert len(posts) < len(ids) * 0.75                 # steps of 35 ms: about every other one
    assert stream.n_tokens == len(ids) and not stream.stopped


def test_interval_zero_posts_every_step_with_text(tokenizer):
    ids = tokenizer(TEXT).input_ids
    posts, _ = run(tokenizer, ids, interval=0.0)
    assert "".join(text for _, text in posts) == TEXT
    # every step posts unless its text is half a character (held until it completes)
    assert len(posts) >= len(ids) - sum(t.endswith("\ufffd") for t in
                                        (tokenizer.decode(ids[:i]) for i in range(1, len(ids))))


def test_held_steps_are_not_decoded(tokenizer):
    ids = tokenizer(TEXT * 3).input_ids
    counting = CountingTokenizer(tokenizer)
    posts, _ = run(counting, ids, interval=0.1)
    assert "".join(text for _, text in posts) == TEXT * 3
    assert counting.decodes <= 2 * len(posts) + 2 < len(ids)      # two decodes per post


def test_a_stop_string_ends_the_request_on_its_step_even_between_posts(tokenizer):
    ids = tokenizer(TEXT).input_ids
    stop = "area(2)"
    posts, stream = run(tokenizer, ids, interval=10.0, stop=[stop])
    text = "".join(t for _, t in posts)
    assert stream.stopped and text == TEXT[:TEXT.index(stop)]
    # the request stopped on the step that completed the stop string, not later
    assert stop in tokenizer.decode(ids[:stream.n_tokens])
    assert stop not in tokenizer.decode(ids[:stream.n_tokens - 1])


def test_multi_token_steps_and_a_not_streamed_request(tokenizer):
    ids = tokenizer(TEXT).input_ids
    posts, _ = run(tokenizer, ids, interval=0.05, per_step=4, step_s=0.02)
    assert "".join(t for _, t in posts) == TEXT
    posts, _ = run(tokenizer, ids, interval=0.05, live=False)      # decoded once, at the end
    assert [t for _, t in posts] == [TEXT]


def test_a_negative_interval_is_refused(tokenizer):
    with pytest.raises(ValueError, match="stream interval"):
        TextStream(lambda kind, text: None, tokenizer, [], live=True, interval=-1.0)
