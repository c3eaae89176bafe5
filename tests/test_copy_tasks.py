"""The copy-heavy task sets are deterministic, at least 10 distinct prompts each, and ask for
answers that copy their input (the quoted sections, the table's values, the earlier results)."""
import json

import pytest

from redwood.copy_tasks import KINDS, copy_tasks
from redwood.errors import RedwoodError


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_distinct_and_named(kind):
    first, again = copy_tasks(kind, 12), copy_tasks(kind, 12)
    assert first == again and len({t.prompt for t in first}) == 12
    assert [t.name for t in first] == [f"{kind}-{i}" for i in range(12)]


def test_rag_asks_about_sections_of_its_manual():
    for task in copy_tasks("rag", 10):
        asked = task.prompt.split("what do `")[1].split("`")
        assert f"## {asked[0]}\n" in task.prompt and f"## {asked[2]}\n" in task.prompt


def test_convert_table_rows_and_quoted_values():
    import csv
    import io

    for task in copy_tasks("convert", 10):
        table = task.prompt.split("```csv\n")[1].split("```")[0]
        rows = list(csv.DictReader(io.StringIO(table)))
        assert len(rows) == 8 and all(r["task_id"].startswith("HumanEval/") for r in rows)
        assert all(r["function"] and r["summary"] for r in rows)


def test_agent_steps_grow_a_transcript_of_valid_json_calls():
    tasks = copy_tasks("agent", 10)
    for i, task in enumerate(tasks):
        calls = [line[len("Assistant: "):] for line in task.prompt.splitlines()
                 if line.startswith("Assistant: ")]
        assert len(calls) == i + 1
        assert all(json.loads(c)["tool"] == "run_tests" for c in calls)
    assert tasks[1].prompt.split("The session so far:")[1].startswith(
        tasks[0].prompt.split("The session so far:")[1].split("\n\nNext")[0])


def test_bad_arguments():
    with pytest.raises(RedwoodError):
        copy_tasks("yaml", 2)
    with pytest.raises(RedwoodError):
        copy_tasks("rag", 0)
