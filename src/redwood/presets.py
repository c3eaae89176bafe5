"""Trees shipped with the package."""
from __future__ import annotations

from importlib import resources

from redwood.tree import Tree


def default_tree() -> Tree:
    """A small tree for the default model pair on a CPU (see data/default_tree.json's source)."""
    path = resources.files("redwood") / "data" / "default_tree.json"
    return Tree.load(str(path))
