"""What one batched decode runs for the lanes of a MultiSeqContext (llamacpp_multi.py): a
request's `Lane`, the jobs (`Append`, `TreeNodes`), a job validated into batch rows
(`Prepared`), and the rows of a job taken from the decode's logits."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from redwood.backends.llamacpp_batch import TreeSeqs, check_tree_nodes, node_rows, tree_step
from redwood.errors import RedwoodError
from redwood.plan.tree import Tree


@dataclass(eq=False)
class Lane:
    """One request's sequence ids base..base+width-1 and its cache bookkeeping."""
    index: int
    base: int
    width: int
    length: int = 0                  # committed tokens (positions 0..length-1 on `base`)
    step: dict | None = None         # the tentative tree of the current step, or None
    busy: bool = False
    tokens: list[int] = field(default_factory=list)   # ids of the committed cells [length]
    used: int = 0                    # when it was last released (LRU order of idle caches)

    @property
    def cells(self) -> int:
        """KV cells the lane holds: committed tokens plus tentative nodes."""
        return self.length + (self.step["cells"] if self.step else 0)


@dataclass(eq=False)
class Append:
    """Run `ids` causally after the lane's committed prefix and commit them; logits of the
    last `rows` of them."""
    lane: Lane
    ids: Sequence[int] | np.ndarray
    rows: int = 0


@dataclass(eq=False)
class TreeNodes:
    """Run tree nodes as tentative nodes of the lane (the Backend.run_tree contract, per lane):
    `nodes` in BFS order, token ids `tokens` [len(nodes)], node u at root_position + depth(u);
    the root is run as node 0 (root_position == lane.length) or is already committed
    (root_position == lane.length - 1). rows: which of `nodes` need logits (None = all)."""
    lane: Lane
    tree: Tree
    nodes: Sequence[int]
    tokens: Sequence[int] | torch.Tensor | np.ndarray
    root_position: int
    rows: Sequence[int] | None = None


@dataclass
class Prepared:
    """A validated job as batch rows: ids [n] int32, positions [n], seq ids per row, outputs."""
    job: object
    ids: np.ndarray
    positions: np.ndarray
    seqs: list[np.ndarray]
    outputs: np.ndarray              # [n] int8, 1 where logits are wanted
    rows: list[int]                  # the job's rows, in the order it asked for them
    step: dict | None = None         # TreeNodes: the lane's step after this call
    first: bool = False              # TreeNodes: the step's first call (branch the prefix)
    extra: dict = field(default_factory=dict)


def one_token(job) -> bool:
    """Whether a job is one Python-int token with its row (a plain step's append)."""
    return type(job) is Append and job.rows == 1 and len(job.ids) == 1 \
        and type(job.ids[0]) is int


def prepare_append(job: Append, ids: np.ndarray) -> Prepared:
    """An Append as batch rows after the lane's committed prefix; `ids` its checked token ids."""
    lane = job.lane
    n, rows = len(ids), max(0, min(int(job.rows), len(ids)))
    outputs = np.zeros(n, dtype=np.int8)
    outputs[n - rows:] = 1 if rows else 0
    seq = np.array([lane.base], dtype=np.int32)
    return Prepared(job, ids, np.arange(lane.length, lane.length + n), [seq] * n, outputs,
                    list(range(n - rows, n)), extra={"start": lane.length})


def prepare_tree(job: TreeNodes, layout: TreeSeqs, ids: np.ndarray) -> Prepared:
    """Tree nodes as batch rows on the lane's sequence ids (the tree checked against the lane's
    width by the caller); `ids` the nodes' checked token ids. Starts the lane's step on its
    first call (Prepared.first: the caller branches the prefix into the leaf ids)."""
    lane = job.lane
    nodes = [int(u) for u in job.nodes]
    if len(ids) != len(nodes) or not nodes:
        raise RedwoodError(f"tree job got {len(nodes)} nodes and {len(ids)} tokens")
    rows = node_rows(job.rows, len(nodes), "tree job")
    first = lane.step is None
    step = tree_step(lane.step, layout, job.root_position, lane.length, "tree job")
    check_tree_nodes(step, nodes)
    index = np.array(nodes)
    outputs = np.zeros(len(nodes), dtype=np.int8)
    outputs[rows] = 1
    seqs = [layout.seqs[u] + lane.base for u in nodes]
    return Prepared(job, ids, job.root_position + layout.depths[index], seqs, outputs, rows,
                    step=step, first=first)


def take_rows(logits: torch.Tensor, index: np.ndarray) -> torch.Tensor:
    """logits[index] for a [rows, V] tensor. Indexing a tensor with a numpy array costs ~5-10 ms
    at V = 151936 (torch walks it as a sequence), a sizeable part of a 28 ms one-token step; the
    usual case (a job's rows in batch order) is a contiguous range, so a zero-copy slice."""
    first = int(index[0])
    if np.array_equal(index, np.arange(first, first + len(index))):
        return logits[first:first + len(index)]
    return logits[torch.from_numpy(index.astype(np.int64))]

