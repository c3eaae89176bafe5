"""The `chat` prompt set: general chat requests shipped in the package, fixed and varied, and
`redwood bench --prompt-set chat` loads them in the chat template (raw text, with a note, for
a tokenizer without one)."""
from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from redwood.bench.prompt_sets import PROMPT_SETS, check_prompt_sets, load_prompt_sets
from redwood.chat_prompts import (CALIBRATION_COUNT, CHAT_PROMPTS, chat_calibration_prompts,
                                  chat_prompts)
from redwood.cli.main import main
from redwood.errors import RedwoodError

CATEGORIES = {"creative", "explain", "reasoning", "math", "advice", "summarise"}


def test_the_set_is_varied_fixed_and_numbered():
    prompts = chat_prompts()
    assert len(prompts) == len(CHAT_PROMPTS) >= 24
    assert [name for name, _, _ in prompts] == [f"chat-{i}" for i in range(len(prompts))]
    texts = [text for _, _, text in prompts]
    assert len(set(texts)) == len(texts) and all(len(t) > 40 for t in texts)
    kinds = Counter(category for _, category, _ in prompts)
    assert set(kinds) == CATEGORIES and min(kinds.values()) >= 3
    # the summaries carry the paragraph they ask about
    assert all(len(text) > 300 for _, category, text in prompts if category == "summarise")
    assert chat_prompts(3) == prompts[:3] and chat_prompts() == prompts
    with pytest.raises(RedwoodError, match="integer >= 1"):
        chat_prompts(0)


class _ByteTokenizer:
    """No chat template: the user message is encoded as raw text."""
    chat_template = None
    bos_token_id = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(text.encode())[:64]}

    def encode(self, text, add_special_tokens=False):
        return self(text)["input_ids"]


def test_prompt_set_loads_without_a_chat_template():
    assert "chat" in PROMPT_SETS and check_prompt_sets(["chat", "humaneval"]) == ("chat", "humaneval")
    pair = SimpleNamespace(tokenizer=_ByteTokenizer())
    prompts, notes = load_prompt_sets(pair, ["chat"], 5)
    assert [p.name for p in prompts] == [f"chat-{i}" for i in range(5)]
    assert all(p.prompt_set == "chat" and p.encoding == "raw" for p in prompts)
    assert prompts[1].ids.tolist() == list(CHAT_PROMPTS[1][1].encode())[:64]
    assert any("chat" in n and "no chat template" in n for n in notes)


def test_prompt_set_is_encoded_with_the_chat_template(shipped_tokenizer):
    pair = SimpleNamespace(tokenizer=shipped_tokenizer)
    prompts, notes = load_prompt_sets(pair, ["chat"], 24)
    assert len(prompts) == 24 and len(notes) == 1 and "calibration split" in notes[0]
    assert load_prompt_sets(pair, ["chat"], 12)[1] == []
    for prompt, (_, text) in zip(prompts, CHAT_PROMPTS):
        assert prompt.encoding == "chat" and prompt.ids.dtype == torch.long
        decoded = shipped_tokenizer.decode(prompt.ids)
        assert "<|im_start|>user\n" + text in decoded
        assert decoded.rstrip().endswith("<|im_start|>assistant")


def test_cli_bench_runs_the_chat_set(tmp_path):
    torch.set_num_threads(1)
    assert main(["bench", "--quick", "--prompt-set", "chat", "--prompts", "2",
                 "--temperatures", "0", "--max-new-tokens", "8", "--out-dir", str(tmp_path),
                 "--machine", "test"]) == 0
    [summary] = [p for p in tmp_path.glob("test-*.json") if not p.name.endswith(".raw.json")]
    doc = json.loads(summary.read_text())
    assert doc["prompt_sets"]["chat"]["prompts"] == 2
    assert {r["prompt_set"] for r in doc["summary"]} == {"chat"}


def test_the_calibration_split_is_the_last_prompts_and_loads_in_the_chat_template(
        shipped_tokenizer):
    from redwood.measure.calibrate import calibration_prompts

    texts = chat_calibration_prompts()
    assert len(texts) == CALIBRATION_COUNT <= len(CHAT_PROMPTS) - 10     # the bench's usual 10
    assert texts == [text for _, text in CHAT_PROMPTS[-CALIBRATION_COUNT:]]
    ids, label = calibration_prompts(shipped_tokenizer, "chat", 3)
    assert len(ids) == 3 and "chat calibration split" in label and "chat template" in label
    assert f"chat-{len(CHAT_PROMPTS) - CALIBRATION_COUNT}.." in label
    decoded = shipped_tokenizer.decode(ids[0])
    assert "<|im_start|>user\n" + texts[0] in decoded
