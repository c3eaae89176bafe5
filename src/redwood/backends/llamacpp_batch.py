"""Helpers of the llama.cpp backend (llamacpp.py): the tree as sequence ids and the reusable
native batch.

Tree as sequence ids (docs/design.md, "Backends"): leaf k of the tree (leaves in BFS order) is
sequence k, and every node carries the ids of all leaves below it. llama.cpp lets a token attend
to a cache cell iff the cell carries the token's first sequence id and sits at a position <= the
token's, so a node sees the committed prefix (copied into every leaf sequence), its ancestors
and itself, and never a sibling or cousin (they share no leaf).
"""
from __future__ import annotations

import numpy as np

from redwood.errors import RedwoodError

from redwood.plan.tree import Tree


class TreeSeqs:
    """One tree shape as sequence ids: `seqs[u]` = int32 ids of the leaves below node u
    (sorted; node u's first id is its first leaf), `n_leaves` sequences in all."""

    def __init__(self, tree: Tree):
        below: list[list[int]] = [[] for _ in range(len(tree))]
        leaves = [u for u in range(len(tree)) if not tree.children[u]]
        for k, leaf in enumerate(leaves):
            below[leaf].append(k)
        for u in range(len(tree) - 1, 0, -1):       # children come after their parents (BFS)
            below[tree.parents[u]].extend(below[u])
        self.seqs = [np.array(sorted(ids), dtype=np.int32) for ids in below]
        self.n_leaves = len(leaves)
        self.parents = list(tree.parents)
        self.depths = np.asarray(tree.depths, dtype=np.int64)


class TreeLayouts:
    """TreeSeqs per tree shape, cached (planned trees recur) and bounded: when full, only the
    layouts still in use by a running step are kept."""

    def __init__(self, limit: int):
        self.limit, self._cache = limit, {}

    def get(self, tree, live=()) -> TreeSeqs:
        key = tuple(tree.parents)
        if key not in self._cache:
            if len(self._cache) >= self.limit:
                self._cache = {tuple(layout.parents): layout for layout in live}
            self._cache[key] = TreeSeqs(tree)
        return self._cache[key]


class NativeBatch:
    """One `llama_batch` of `capacity` tokens with up to `n_seq_max` sequence ids each,
    allocated once and refilled through numpy views of its arrays."""

    def __init__(self, llama_cpp, capacity: int, n_seq_max: int):
        self._llama = llama_cpp
        self.capacity = capacity
        self.batch = llama_cpp.llama_batch_init(capacity, 0, n_seq_max)
        view = np.ctypeslib.as_array
        self.token = view(self.batch.token, shape=(capacity,))
        self.pos = view(self.batch.pos, shape=(capacity,))
        self.n_seq_id = view(self.batch.n_seq_id, shape=(capacity,))
        self.logits = view(self.batch.logits, shape=(capacity,))
        self.seq_rows = [view(self.batch.seq_id[i], shape=(n_seq_max,)) for i in range(capacity)]

    def fill_one(self, token: int, position: int) -> None:
        """fill_causal([token], position, 1) in sequence 0, through fill_tokens."""
        self.fill_tokens(((token, position, 0),))

    def fill_tokens(self, rows) -> None:
        """Rows of (token, position, sequence id), one token each, logits for every row,
        through ctypes alone: a plain step's batch (one token per request), where
        fill_causal's small numpy writes cost more than the step's other Python around a
        decode (their code is cold right after one)."""
        batch = self.batch
        for i, (token, position, seq) in enumerate(rows):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, position, 1
            batch.seq_id[i][0], batch.logits[i] = seq, 1
        batch.n_tokens = len(rows)

    def fill_causal(self, ids: np.ndarray, start: int, outputs: int) -> None:
        """ids at positions start.. in sequence 0; logits for the last `outputs` of them."""
        n = len(ids)
        self.token[:n] = ids
        self.pos[:n] = np.arange(start, start + n)
        self.n_seq_id[:n] = 1
        for row in self.seq_rows[:n]:
            row[0] = 0
        self.logits[:n] = 0
        self.logits[n - outputs:n] = 1 if outputs else 0
        self.batch.n_tokens = n

    def fill_tree(self, ids: np.ndarray, positions: np.ndarray, seqs: list[np.ndarray],
                  outputs: np.ndarray) -> None:
        """Token i at positions[i] carrying sequence ids seqs[i]; outputs[i] != 0 for logits."""
        n = len(ids)
        self.token[:n] = ids
        self.pos[:n] = positions
        for i, ids_i in enumerate(seqs):
            self.seq_rows[i][:len(ids_i)] = ids_i
            self.n_seq_id[i] = len(ids_i)
        self.logits[:n] = outputs
        self.batch.n_tokens = n

    def free(self) -> None:
        if self.batch is not None:
            self.token = self.pos = self.n_seq_id = self.logits = None    # views of freed memory
            self.seq_rows = []
            self._llama.llama_batch_free(self.batch)
            self.batch = None


def check_path(step: dict, nodes: list[int]) -> None:
    """keep_path's chain rules: `nodes` is a chain of nodes run this step, starting at the
    tentative root (node 0) or at a child of the committed root."""
    parents = step["layout"].parents
    if not 0 <= nodes[0] < len(parents):
        raise RedwoodError(f"keep_path node {nodes[0]} is out of range")
    if (nodes[0] != 0) if step["root_run"] else (parents[nodes[0]] != 0):
        start = "the root, node 0" if step["root_run"] else "a child of the committed root"
        raise RedwoodError(f"keep_path must start at {start}; got node {nodes[0]}")
    for a, b in zip(nodes, nodes[1:]):
        if not 0 <= b < len(parents) or parents[b] != a:
            raise RedwoodError(f"keep_path nodes {nodes} are not a chain "
                               f"(node {b} is not a child of {a})")
    missing = [u for u in nodes if u not in step["ran"]]
    if missing:
        raise RedwoodError(f"keep_path: nodes {missing} were not run this step")


def node_rows(rows, n_nodes: int, what: str) -> list[int]:
    """Which of a tree call's `n_nodes` nodes need logits (None = all), checked."""
    rows = list(range(n_nodes)) if rows is None else [int(r) for r in rows]
    if any(r < 0 or r >= n_nodes for r in rows):
        raise RedwoodError(f"{what} rows {rows} must index the {n_nodes} nodes")
    return rows


def tree_step(step: dict | None, layout: TreeSeqs, root_position: int, length: int,
              what: str) -> dict:
    """The step a tree call runs in, on a sequence holding `length` committed tokens: a new
    one when `step` is None (the root run as node 0 at position `length`, or committed at
    length - 1), else `step`, which must be of the same tree and root."""
    if step is None:
        if root_position not in (length, length - 1) or root_position < 0:
            raise RedwoodError(f"{what} root_position {root_position} must be the committed "
                               f"length {length} (root run as node 0) or {length - 1} (root "
                               "committed)")
        return {"layout": layout, "root": root_position, "ran": set(), "cells": 0,
                "root_run": root_position == length, "tokens": {}}
    if layout.parents != step["layout"].parents or root_position != step["root"]:
        raise RedwoodError(f"{what} called with another tree or root position in the same "
                           "step; call keep_path first")
    return step


def check_tree_nodes(step: dict, nodes: list[int]) -> None:
    """run_tree's rules for the nodes of one call: distinct, in BFS order, in range, not run
    before this step, each with its parent run (earlier or in this call) or committed."""
    parents, ran = step["layout"].parents, step["ran"]
    if any(b <= a for a, b in zip(nodes, nodes[1:])):
        raise RedwoodError(f"run_tree nodes {nodes} must be distinct and in BFS order")
    if nodes[0] < 0 or nodes[-1] >= len(parents):
        raise RedwoodError(f"run_tree nodes {nodes} out of range for a "
                           f"{len(parents)}-node tree")
    batch = set()
    for u in nodes:
        if u in ran:
            raise RedwoodError(f"run_tree: node {u} was already run this step")
        if u == 0:
            if not step["root_run"]:
                raise RedwoodError("run_tree: the root is committed (root_position = cache "
                                   "length - 1); run its descendants, not node 0")
        elif not (parents[u] in ran or parents[u] in batch
                  or (parents[u] == 0 and not step["root_run"])):
            raise RedwoodError(f"run_tree: node {u}'s parent {parents[u]} has not been run")
        batch.add(u)
