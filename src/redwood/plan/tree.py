"""Draft trees: nodes in breadth-first order, node 0 the root, siblings in rank order.

A tree is stored as its `parents` list (`parents[0] == -1`). Node 0 is the last accepted
token; the children of a node are the draft's proposals for the next token, rank 1 first.
Breadth-first order with siblings in rank order is exactly "parents never decrease", which
is what the validation checks.

Depth has two conventions, both used on purpose:
- per node, `depths[i]` counts edges from the root (root 0): it is the position offset of
  node i after the prefix;
- per tree, `num_levels` counts levels with the root as level 1, like the planner's DP
  (a root alone has 1 level, a chain of 3 nodes has 3). The JSON "depth" field and every
  `max_depth` argument use this second convention.

JSON format (docs/design.md §7): {"format": 1, "kind": "tree", "parents": [...],
"expected_length": G, "budget": n, "depth": d, "source": {...}}.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from redwood.errors import RedwoodError

TREE_FORMAT = 1


def _check_parents(parents, max_depth=None) -> list[int]:
    """Return parents as a list of int, or raise RedwoodError saying what is wrong."""
    if isinstance(parents, (str, bytes)) or not hasattr(parents, "__len__"):
        raise RedwoodError("tree parents must be a list of integers, e.g. [-1, 0, 0, 1]")
    if len(parents) == 0:
        raise RedwoodError("empty tree: parents must contain at least the root, [-1]")
    out = []
    for i, x in enumerate(parents):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            raise RedwoodError(f"tree parents[{i}] is {x!r}; parents must be integers")
        out.append(int(x))
    if out[0] != -1:
        raise RedwoodError(f"tree parents[0] is {out[0]}; node 0 must be the root, with parent -1")
    for i in range(1, len(out)):
        par = out[i]
        if par == -1:
            raise RedwoodError(f"second root: node {i} has parent -1; only node 0 may be the root")
        if par < 0 or par >= len(out):
            raise RedwoodError(f"tree parents[{i}] = {par} is out of range 0..{len(out) - 1}")
        if par >= i:
            raise RedwoodError(f"tree parents[{i}] = {par} is not before its child; "
                               "every parent must come before its children")
        if par < out[i - 1]:
            raise RedwoodError(f"parents not in BFS order: node {i} has parent {par} after node "
                               f"{i - 1} with parent {out[i - 1]}; list nodes level by level, "
                               "children of earlier nodes first (parents never decrease)")
    if max_depth is not None:
        levels = _num_levels(out)
        if levels > max_depth:
            raise RedwoodError(f"tree has {levels} levels (root = level 1), above the limit "
                               f"max_depth={max_depth}; plan a shallower tree")
    return out


def _num_levels(parents: list[int]) -> int:
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return max(depth) + 1


class Tree:
    """A draft tree. Construct from a parents list; invalid input raises RedwoodError.

    Attributes: `parents` (list[int]), `children` (list[list[int]], rank order),
    `depths` (int64 array, root 0 = position offsets), `ranks` (int64 array, 1-based,
    root 0), `source` (dict: how the tree was made).
    """

    def __init__(self, parents, source=None, max_depth=None):
        self.parents = _check_parents(parents, max_depth)
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

    def __eq__(self, other):
        return isinstance(other, Tree) and self.parents == other.parents

    def __hash__(self):
        return hash(tuple(self.parents))

    def __repr__(self):
        return f"Tree(n={len(self)}, levels={self.num_levels}, widths={self.level_sizes})"

    # --- derived structure -------------------------------------------------------------

    @property
    def num_levels(self) -> int:
        """Number of levels, root = level 1 (the DP's depth)."""
        return int(self.depths.max()) + 1

    @property
    def levels(self) -> list[np.ndarray]:
        """Node indices at each depth (BFS order makes each level a contiguous range)."""
        return [np.nonzero(self.depths == d)[0] for d in range(self.num_levels)]

    @property
    def level_sizes(self) -> list[int]:
        """Number of nodes on each level, root level first (the draft's batch per level)."""
        return np.bincount(self.depths, minlength=self.num_levels).tolist()

    @property
    def position_offsets(self) -> np.ndarray:
        """Position of each node after the prefix, minus the root's position (= depth)."""
        return self.depths.copy()

    @property
    def max_width(self) -> int:
        """Largest number of children of any node (the acceptance vector length it uses)."""
        return max(len(c) for c in self.children)

    def ancestor_mask(self) -> np.ndarray:
        """[n, n] bool: mask[i, j] is True iff node j is node i or one of its ancestors."""
        n = len(self)
        mask = np.eye(n, dtype=bool)
        for i in range(1, n):
            mask[i] |= mask[self.parents[i]]
        return mask

    def node_values(self, p) -> np.ndarray:
        """[n] float64: product of p[rank - 1] along each node's path (root 1; rank > len(p) -> 0)."""
        p = np.asarray(p, dtype=np.float64).ravel()
        value = np.ones(len(self))
        for i in range(1, len(self)):
            r = self.ranks[i]
            value[i] = value[self.parents[i]] * (p[r - 1] if r <= len(p) else 0.0)
        return value

    def expected_length(self, p) -> float:
        """Expected tokens per step under positional acceptance p (the root counts 1)."""
        return float(self.node_values(p).sum())

    # --- path-list exports (vLLM speculative_token_tree, Medusa choices) ----------------

    def paths(self) -> list[tuple[int, ...]]:
        """0-based child ranks from the root to each node, root excluded, BFS order."""
        out: list[tuple[int, ...]] = [()]
        for i in range(1, len(self)):
            out.append(out[self.parents[i]] + (int(self.ranks[i]) - 1,))
        return out[1:]

    def to_vllm(self) -> list[tuple[int, ...]]:
        """vLLM `speculative_token_tree` form, e.g. [(0,), (1,), (0, 0)]."""
        return self.paths()

    def to_medusa(self) -> list[list[int]]:
        """Medusa choices form, e.g. [[0], [1], [0, 0]]."""
        return [list(path) for path in self.paths()]

    @classmethod
    def from_paths(cls, paths, source=None) -> "Tree":
        """Inverse of `to_vllm` / `to_medusa`; any order is accepted, BFS order is rebuilt.

        Every prefix of a path must be present, and a node's ranks must be 0..k-1 with no gap.
        """
        keys = []
        for path in paths:
            if isinstance(path, (str, bytes)) or not hasattr(path, "__iter__"):
                raise RedwoodError(f"tree path {path!r} must be a list of 0-based ranks")
            key = tuple(path)
            if not key or any(isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0
                              for r in key):
                raise RedwoodError(f"tree path {list(key)} must be a non-empty list of ranks >= 0")
            keys.append(tuple(int(r) for r in key))
        if len(set(keys)) != len(keys):
            raise RedwoodError("tree paths contain a duplicate")
        order = sorted(keys, key=lambda k: (len(k), k))   # BFS: by level, then parent order, rank
        index = {(): 0}
        parents = [-1]
        for key in order:
            if key[:-1] not in index:
                raise RedwoodError(f"tree path {list(key)} has no parent path {list(key[:-1])}")
            if key[-1] > 0 and key[:-1] + (key[-1] - 1,) not in index:
                raise RedwoodError(f"tree path {list(key)} skips rank {key[-1] - 1}; "
                                   "sibling ranks must be 0, 1, 2, ... without gaps")
            index[key] = len(parents)
            parents.append(index[key[:-1]])
        return cls(parents, source=source)

    # --- JSON ----------------------------------------------------------------------------

    def to_dict(self, p=None) -> dict:
        """The JSON object of docs/design.md §7; expected_length is filled in when p is given
        (or kept from `source["expected_length"]`)."""
        expected = self.expected_length(p) if p is not None else self.source.get("expected_length")
        return {"format": TREE_FORMAT, "kind": "tree", "parents": list(self.parents),
                "expected_length": expected, "budget": len(self), "depth": self.num_levels,
                "source": self.source}

    @classmethod
    def from_dict(cls, data, max_depth=None, where="tree") -> "Tree":
        if not isinstance(data, dict):
            raise RedwoodError(f"{where}: expected a JSON object with a 'parents' list")
        if data.get("kind", "tree") != "tree":
            raise RedwoodError(f"{where}: kind is {data.get('kind')!r}, expected 'tree'")
        if data.get("format", TREE_FORMAT) != TREE_FORMAT:
            raise RedwoodError(f"{where}: format {data.get('format')!r} is not supported "
                               f"(this redwood reads format {TREE_FORMAT})")
        if "parents" not in data:
            raise RedwoodError(f"{where}: missing 'parents' (list of parent indices, root -1)")
        try:
            tree = cls(data["parents"], source=data.get("source"), max_depth=max_depth)
        except RedwoodError as exc:
            raise RedwoodError(f"{where}: {exc}") from None
        if data.get("expected_length") is not None:
            tree.source.setdefault("expected_length", data["expected_length"])
        return tree

    def save(self, path, p=None) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(p), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path, max_depth=None) -> "Tree":
        """Load and validate a tree JSON file; `max_depth` limits levels (root = level 1)."""
        return cls.from_dict(read_json(path, "tree"), max_depth=max_depth, where=str(path))

    # --- display -------------------------------------------------------------------------

    def render(self, p=None, max_nodes=200) -> str:
        """ASCII drawing for the terminal (node values shown when p is given)."""
        from redwood.plan.render import render_ascii

        return render_ascii(self, p=p, max_nodes=max_nodes)


def bfs_renumber(parents: list[int]) -> tuple[list[int], list[int]]:
    """A tree given by `parents` (root 0, parents[0] = -1, any node order in which each parent
    comes before its children) renumbered breadth-first, each node's children in their old
    index order: (new parents for Tree, old node index of each new node)."""
    children = [[] for _ in parents]
    for v in range(1, len(parents)):
        children[parents[v]].append(v)
    order = [0]
    for u in order:                              # `order` grows while we walk it
        order.extend(children[u])
    index = {u: i for i, u in enumerate(order)}
    return [-1] + [index[parents[u]] for u in order[1:]], order


def read_json(path, what: str):
    """Read a JSON file, turning missing files and syntax errors into one-line RedwoodErrors."""
    path = Path(path)
    if not path.is_file():
        raise RedwoodError(f"{what} file not found: {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RedwoodError(f"{path}: not valid JSON ({exc}); expected a {what} file") from None


# --- baseline builders ------------------------------------------------------------------

def chain(length: int) -> Tree:
    """A chain of `length` nodes including the root (length - 1 speculated tokens)."""
    length = _positive_int(length, "chain length")
    return Tree([-1] + list(range(length - 1)), source={"builder": "chain", "length": length})


def star(width: int) -> Tree:
    """The root and `width` children (one level of guesses; used to measure acceptance)."""
    width = _positive_int(width, "star width", minimum=0)
    return Tree([-1] + [0] * width, source={"builder": "star", "width": width})


def specinfer(k: int, depth: int) -> Tree:
    """SpecInfer-style: `k` independent chains of `depth` tokens each below the root.

    BFS order: level 1 holds the k chain heads (root ranks 1..k), and each further level
    holds one rank-1 child per chain, in chain order. 1 + k * depth nodes in all.
    """
    k = _positive_int(k, "specinfer k")
    depth = _positive_int(depth, "specinfer depth")
    parents = [-1] + [0] * k
    for level in range(1, depth):
        first = 1 + (level - 1) * k          # first node of the previous level
        parents += list(range(first, first + k))
    return Tree(parents, source={"builder": "specinfer", "k": k, "depth": depth})


def _positive_int(value, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise RedwoodError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def default_tree() -> Tree:
    """A small tree for the default model pair on a CPU (see data/default_tree.json's source)."""
    from importlib import resources

    return Tree.load(str(resources.files("redwood") / "data" / "default_tree.json"))
