"""`redwood plan` and `redwood export` end to end: outputs, files, error exits."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import redwood
from redwood.cli.main import main
from redwood.plan.formats import Acceptance, Profile, sample_acceptance_path
from redwood.plan.planner import choose_tree, optimal_tree
from redwood.plan.tree import Tree

P = [0.8, 0.1, 0.05, 0.02]


@pytest.fixture
def acceptance(tmp_path):
    return Acceptance(p=P, dataset="unit test").save(tmp_path / "acc.json")


@pytest.fixture
def profile(tmp_path):
    prof = Profile(target_ms={1: 300, 2: 340, 4: 420, 8: 560, 16: 830},
                   draft_ms={1: 40, 2: 42, 4: 45, 8: 50, 16: 60})
    return prof.save(tmp_path / "prof.json")


def test_plan_without_profile(tmp_path, acceptance, capsys):
    out = tmp_path / "tree.json"
    rc = main(["plan", "--acceptance", str(acceptance), "--budget", "20", "--max-depth", "5",
               "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    expected = optimal_tree(P, 20, 5)
    assert Tree.load(out) == expected
    data = json.loads(out.read_text())
    assert data["budget"] == 20 and data["depth"] == expected.num_levels
    assert data["expected_length"] == pytest.approx(expected.expected_length(P))
    assert f"{expected.expected_length(P):.4f}" in text
    assert "0 root" in text and f"{len(expected)} nodes" in text


def test_plan_with_profile_and_plot(tmp_path, acceptance, profile, capsys):
    out, plot = tmp_path / "tree.json", tmp_path / "plan.png"
    rc = main(["plan", "--acceptance", str(acceptance), "--profile", str(profile),
               "--budget", "16", "--max-depth", "6", "--out", str(out), "--plot", str(plot)])
    assert rc == 0
    text = capsys.readouterr().out
    choice = choose_tree(P, Profile.load(profile), 16, 6)
    assert Tree.load(out) == choice.tree
    assert f"chosen: n = {choice.budget}, d = {choice.depth}" in text
    assert f"{choice.speedup:.3f}x" in text
    rows = [line for line in text.splitlines() if line[:1] in "* " and line[2:7].strip().isdigit()]
    assert [int(r.split()[-8]) for r in rows] == [1, 2, 4, 8, 16]      # one row per budget
    assert sum(r.startswith("*") for r in rows) == 1
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_with_shipped_samples(capsys):
    assert main(["plan", "--acceptance", "sample", "--profile", "sample",
                 "--budget", "32", "--max-depth", "8"]) == 0
    assert "chosen: n = " in capsys.readouterr().out


@pytest.fixture
def tree_file(tmp_path):
    return Tree([-1, 0, 0, 1, 1, 2, 3]).save(tmp_path / "t.json", p=P)


def test_export_formats(tree_file, tmp_path, capsys):
    tree = Tree.load(tree_file)
    assert main(["export", str(tree_file), "--format", "vllm"]) == 0
    vllm = ast.literal_eval(capsys.readouterr().out.strip())
    assert vllm == [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    assert Tree.from_paths(vllm) == tree
    assert main(["export", str(tree_file), "--format", "medusa"]) == 0
    assert Tree.from_paths(json.loads(capsys.readouterr().out)) == tree
    assert main(["export", str(tree_file), "--format", "json"]) == 0
    assert Tree.from_dict(json.loads(capsys.readouterr().out)) == tree
    target = tmp_path / "choices.txt"
    assert main(["export", str(tree_file), "--format", "medusa", "--out", str(target)]) == 0
    assert Tree.from_paths(json.loads(target.read_text())) == tree


def _error(argv, capsys):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    return lines[0]


def test_plan_errors(tmp_path, acceptance, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 1, "kind": "acceptance", "p": [0.9, 0.3]}))
    base = ["--budget", "8", "--max-depth", "4"]
    assert "sum(p)" in _error(["plan", "--acceptance", str(bad)] + base, capsys)
    assert "not found" in _error(["plan", "--acceptance", str(tmp_path / "no.json")] + base, capsys)
    assert "no tree of 8 nodes fits in 2 levels" in _error(
        ["plan", "--acceptance", str(acceptance), "--budget", "8", "--max-depth", "2"], capsys)
    assert "budget must be" in _error(
        ["plan", "--acceptance", str(acceptance), "--budget", "0", "--max-depth", "2"], capsys)
    prof = tmp_path / "prof.json"
    prof.write_text(json.dumps({"format": 1, "kind": "profile", "target_ms": {"2": 5},
                                "draft_ms": {"1": 1}}))
    assert "no entry for size 1" in _error(
        ["plan", "--acceptance", str(acceptance), "--profile", str(prof)] + base, capsys)
    assert "cannot write" in _error(["plan", "--acceptance", str(acceptance), "--out",
                                     str(tmp_path / "missing-dir" / "t.json")] + base, capsys)
    with pytest.raises(SystemExit) as info:                       # argparse: usage error
        main(["plan", "--acceptance", str(acceptance)])
    assert info.value.code == 2


def test_export_errors(tmp_path, tree_file, capsys):
    unordered = tmp_path / "u.json"
    unordered.write_text(json.dumps({"format": 1, "kind": "tree", "parents": [-1, 0, 0, 2, 1]}))
    assert "not in BFS order" in _error(["export", str(unordered)], capsys)
    assert "above the limit max_depth=2" in _error(
        ["export", str(tree_file), "--max-depth", "2"], capsys)
    assert "not found" in _error(["export", str(tmp_path / "none.json")], capsys)
    with pytest.raises(SystemExit):
        main(["export", str(tree_file), "--format", "onnx"])


def test_subprocess_error_has_no_traceback(tmp_path):
    src = str(Path(redwood.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    run = subprocess.run([sys.executable, "-m", "redwood.cli", "plan", "--acceptance", str(bad),
                          "--budget", "8", "--max-depth", "3"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr and "not valid JSON" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    ok = subprocess.run([sys.executable, "-m", "redwood.cli", "plan", "--acceptance",
                         str(sample_acceptance_path()), "--budget", "6", "--max-depth", "3"],
                        capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0 and "expected tokens per step" in ok.stdout
