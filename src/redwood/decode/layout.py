"""A tree's shape as tensors, computed once per (tree, device) rather than every step."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from redwood.plan.tree import Tree


@dataclass(frozen=True)
class TreeLayout:
    tree: Tree
    ancestor: torch.Tensor      # [n, n] bool, ancestor-or-self
    depths: torch.Tensor        # [n] long, root 0

    @classmethod
    def build(cls, tree: Tree, device) -> "TreeLayout":
        return cls(tree, torch.as_tensor(tree.ancestor_mask(), device=device),
                   torch.as_tensor(tree.depths, dtype=torch.long, device=device))


class LayoutCache:
    """TreeLayouts by shape: pruned subtrees of a few trees recur step after step."""

    def __init__(self, device, limit: int = 256):
        self.device, self.limit = device, limit
        self._layouts: dict[tuple, TreeLayout] = {}

    def __call__(self, tree: Tree) -> TreeLayout:
        key = tuple(tree.parents)
        if key not in self._layouts:
            if len(self._layouts) >= self.limit:          # requests may bring their own trees
                self._layouts.clear()
            self._layouts[key] = TreeLayout.build(tree, self.device)
        return self._layouts[key]
