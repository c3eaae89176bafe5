"""Draft trees: nodes in breadth-first order, node 0 the root, siblings in rank order.

(Minimal core written first so the engine can start; the planner issue extends it
with validation, JSON, exports and rendering. Keep these attribute names.)
"""
from __future__ import annotations

import numpy as np


class Tree:
    def __init__(self, parents, source=None):
        self.parents = [int(x) for x in parents]
        self.source = dict(source or {})
        n = len(self.parents)
        self.children = [[] for _ in range(n)]
        self.depths = np.zeros(n, dtype=np.int64)     # root depth 0 == position offset
        self.ranks = np.zeros(n, dtype=np.int64)      # 1-based rank among siblings, root 0
        for i in range(1, n):
            par = self.parents[i]
            self.children[par].append(i)
            self.depths[i] = self.depths[par] + 1
            self.ranks[i] = len(self.children[par])

    def __len__(self):
        return len(self.parents)

    @property
    def num_levels(self) -> int:
        return int(self.depths.max()) + 1

    @property
    def levels(self) -> list[np.ndarray]:
        """Node indices at each depth (BFS order makes each level a contiguous range)."""
        return [np.nonzero(self.depths == d)[0] for d in range(self.num_levels)]

    def ancestor_mask(self) -> np.ndarray:
        """[n, n] bool: mask[i, j] is True iff node j is node i or one of its ancestors."""
        n = len(self)
        mask = np.eye(n, dtype=bool)
        for i in range(1, n):
            mask[i] |= mask[self.parents[i]]
        return mask

    def expected_length(self, p) -> float:
        p = np.asarray(p, dtype=np.float64)
        value = np.ones(len(self))
        for i in range(1, len(self)):
            r = self.ranks[i]
            value[i] = value[self.parents[i]] * (p[r - 1] if r <= len(p) else 0.0)
        return float(value.sum())
