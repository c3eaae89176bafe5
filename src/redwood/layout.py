"""A tree's shape as tensors, computed once per (tree, device) rather than every step."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from redwood.tree import Tree


@dataclass(frozen=True)
class TreeLayout:
    tree: Tree
    ancestor: torch.Tensor      # [n, n] bool, ancestor-or-self
    depths: torch.Tensor        # [n] long, root 0

    @classmethod
    def build(cls, tree: Tree, device) -> "TreeLayout":
        return cls(tree, torch.as_tensor(tree.ancestor_mask(), device=device),
                   torch.as_tensor(tree.depths, dtype=torch.long, device=device))
