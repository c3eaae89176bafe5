"""Package layering that `lint-imports` cannot see, and the design document's citations.

- The planner half imports without torch (docs/design.md §10): checked in a fresh
  interpreter, since this test process has torch loaded already.
- The repository cites only its own design document, docs/design.md, and every "§N"
  it cites exists there.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"

# Spelled in pieces so that this file does not match its own patterns.
FORBIDDEN_CITATIONS = re.compile("|".join([
    "DESIGN" + r"\.md",
    "DESIGN" + " notes",
    r"\.\./" + "shared",
    "/work/" + "shared",
    "shared/" + "notes",
]))
CITATION = re.compile(r"docs/design\.md,?\s+§(\d+(?:\.\d+)?)")
SCANNED = ["src", "tests", "benchmarks", "scripts", "docs", "README.md", "Makefile", ".ci"]
TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".json", ".sh", ".yml", ".yaml", ""}


def _no_torch_after(code: str) -> subprocess.CompletedProcess:
    check = code + "\nimport sys\nassert 'torch' not in sys.modules, sorted(\n" \
        "    m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))\n"
    return subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("code", [
    "import redwood",
    "import redwood.plan, redwood.plan.planner, redwood.plan.tree, redwood.plan.formats, "
    "redwood.plan.adaptive, redwood",
    "from redwood import Tree, optimal_tree, choose_tree, dp_table, chain, star, specinfer",
])
def test_planner_half_imports_without_torch(code):
    result = _no_torch_after(code)
    assert result.returncode == 0, result.stderr


def _scanned_files():
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            yield path
        elif path.is_dir():
            for file in sorted(path.rglob("*")):
                if file.is_file() and file.suffix in TEXT_SUFFIXES \
                        and "__pycache__" not in file.parts:
                    yield file


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return ""


def test_no_citation_outside_the_repository():
    """Design facts are cited from docs/design.md, never from files outside the repository."""
    hits = []
    for path in _scanned_files():
        for number, line in enumerate(_read(path).splitlines(), start=1):
            if FORBIDDEN_CITATIONS.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "cite docs/design.md §N instead:\n" + "\n".join(hits)


def _design_sections() -> set[str]:
    sections = set()
    for line in _read(DESIGN).splitlines():
        match = re.match(r"#{2,4} (\d+(?:\.\d+)?)\.? ", line)
        if match:
            sections.add(match.group(1))
    return sections


def test_design_citations_name_existing_sections():
    sections = _design_sections()
    assert {str(n) for n in range(1, 11)} <= sections
    missing = []
    for path in _scanned_files():
        if path == DESIGN:
            continue
        for number, line in enumerate(_read(path).splitlines(), start=1):
            for section in CITATION.findall(line):
                if section not in sections:
                    missing.append(f"{path.relative_to(ROOT)}:{number}: §{section}")
    assert not missing, "docs/design.md has no such section:\n" + "\n".join(missing)
