"""The prompt sets a `redwood bench` runs on (`--prompt-set`), encoded for the pair.

- `humaneval`: raw completion prompts, the first N of HumanEval's evaluation split (the
  bench's original set; encoded as plain text, `prompts.encode_prompt(chat=False)`).
- `whole_file`, `mixed`, `low_copy`: the input-grounded edit tasks of `redwood.edit_tasks`
  (a whole module with one rename / add type hints and a docstring / rename every variable),
  the first N of each kind. They are chat requests: one user message in the tokenizer's chat
  template (`encode_prompt(chat=True)`). A tokenizer without a chat template (the tiny test
  models, the --quick byte tokenizer) gets the message as raw text instead, and the run's
  notes say so.
- `chat`: general chat requests (creative writing, explanation, reasoning, arithmetic,
  advice, summarising a given paragraph) from `redwood.chat_prompts`, the first N; little of
  the answer copies the prompt. Encoded like the edit sets.
- `rag`, `convert`, `agent`: copy-heavy requests of `redwood.copy_tasks` (quote a pasted
  manual, CSV to JSON, the next step of an agent's tool-call loop), encoded like the edit sets.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from redwood.errors import RedwoodError

EDIT_SETS = ("whole_file", "mixed", "low_copy")
COPY_SETS = ("rag", "convert", "agent")
CHAT_SETS = EDIT_SETS + ("chat",) + COPY_SETS   # one user message each, in the chat template
PROMPT_SETS = ("humaneval",) + CHAT_SETS


@dataclass
class BenchPrompt:
    """One benchmark prompt: its set, a name, its token ids and how they were encoded."""
    prompt_set: str
    name: str                       # "humaneval-0", "whole_file-3", ...
    ids: torch.Tensor               # [L] long
    encoding: str                   # "raw" or "chat"


def check_prompt_sets(sets) -> tuple[str, ...]:
    """The sets as a tuple; RedwoodError on an unknown or repeated name, or none."""
    sets = tuple(sets)
    unknown = [s for s in sets if s not in PROMPT_SETS]
    if unknown or not sets:
        raise RedwoodError(f"unknown prompt set(s) {', '.join(map(str, unknown)) or '(none given)'}"
                           f"; choose from {', '.join(PROMPT_SETS)}")
    repeated = sorted({s for s in sets if sets.count(s) > 1})
    if repeated:
        raise RedwoodError(f"prompt set(s) given twice: {', '.join(repeated)}")
    return sets


def load_prompt_sets(pair, sets, count: int) -> tuple[list[BenchPrompt], list[str]]:
    """(the first `count` prompts of every set, in set order; notes on how they were encoded)."""
    from redwood.chat_prompts import CALIBRATION_FROM
    from redwood.prompts import encode_prompt, has_chat_template, humaneval_prompts

    prompts, notes = [], []
    for name in check_prompt_sets(sets):
        if name == "humaneval":
            texts = humaneval_prompts("evaluation", limit=count)
            prompts += [BenchPrompt(name, f"humaneval-{i}", ids, "raw")
                        for i, ids in enumerate(pair.encode(texts))]
            continue
        chat = has_chat_template(pair.tokenizer)
        for prompt_name, text in _user_messages(name, count):
            prompts.append(BenchPrompt(name, prompt_name,
                                       encode_prompt(pair.tokenizer, text, chat=chat),
                                       "chat" if chat else "raw"))
        if name == "chat" and count > CALIBRATION_FROM:
            notes.append(f"prompt set chat: prompts from chat-{CALIBRATION_FROM} on are also the "
                         "n-gram drafter's calibration split (its shipped priors came from "
                         f"them): run at most {CALIBRATION_FROM} for prompts it has not seen")
        if not chat:
            notes.append(f"prompt set {name}: the tokenizer has no chat template, so each "
                         "request was encoded as raw text (the user message alone, no template)")
    return prompts, notes


def _user_messages(name: str, count: int) -> list[tuple[str, str]]:
    """(prompt name, user message) of the first `count` prompts of a chat-encoded set."""
    if name == "chat":
        from redwood.chat_prompts import chat_prompts

        return [(prompt_name, text) for prompt_name, _, text in chat_prompts(count)]
    if name in COPY_SETS:
        from redwood.copy_tasks import copy_tasks

        return [(task.name, task.prompt) for task in copy_tasks(name, count)]
    from redwood.edit_tasks import edit_tasks

    return [(task.name, task.prompt) for task in edit_tasks(name, count)]


def describe_sets(prompts: list[BenchPrompt]) -> dict[str, dict]:
    """Per set: prompt count, encoding and prompt lengths (for the summary and the tables)."""
    out: dict[str, dict] = {}
    for p in prompts:
        entry = out.setdefault(p.prompt_set, {"prompts": 0, "encoding": p.encoding,
                                              "prompt_tokens": []})
        entry["prompts"] += 1
        entry["prompt_tokens"].append(int(len(p.ids)))
    return out
