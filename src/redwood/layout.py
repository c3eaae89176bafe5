"""A tree's shape as tensors, computed once per (tree, device) rather than every step."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from redwood.tree import Tree


@dataclass(frozen=True)
class Level:
    first: int                  # first node index of this depth (levels are contiguous in BFS order)
    last: int                   # one past the last node index
    parents: list[int]          # nodes of this level that have children
    parent_rows: torch.Tensor   # [len(parents)] their offsets within the level


@dataclass(frozen=True)
class TreeLayout:
    tree: Tree
    ancestor: torch.Tensor      # [n, n] bool, ancestor-or-self
    depths: torch.Tensor        # [n] long, root 0
    levels: list[Level]         # one per depth
    first_leaf_level_node: int  # nodes before this index are run by the draft (levels 0..L-2)

    @classmethod
    def build(cls, tree: Tree, device) -> "TreeLayout":
        levels = []
        for nodes in tree.levels:
            first, last = int(nodes[0]), int(nodes[-1]) + 1
            parents = [int(u) for u in nodes if tree.children[u]]
            rows = torch.tensor([u - first for u in parents], dtype=torch.long, device=device)
            levels.append(Level(first, last, parents, rows))
        return cls(tree, torch.as_tensor(tree.ancestor_mask(), device=device),
                   torch.as_tensor(tree.depths, dtype=torch.long, device=device), levels,
                   levels[-1].first if len(levels) > 1 else 1)
