"""The planner: DP-optimal draft trees (Sequoia) and the hardware-aware choice of their size.

Pure numpy; importing this module never imports torch.

Positional acceptance: the child of rank k is the accepted one with probability p_k
(unconditional, sum p <= 1). A node's value is the product of p_rank along its path, and a
tree's expected tokens per step is the sum of node values (root 1). Conventions:
- budget n = number of nodes *including the root* (a target forward over n tree tokens);
- depth d = number of levels, the root being level 1 (a chain of n nodes has depth n).

The DP of docs/design.md §2: T[m][l][b] = best value of a tree with m nodes, at most l levels and
exactly b root children (ordered by rank); T[1][l][0] = 1 and, for b >= 1,
    T[m][l][b] = max_{1 <= y < m} T[y][l][b-1] + p_b * G[m-y][l-1],   G[m][l] = max_b T[m][l][b]
(the b-th child takes the last m - y nodes). Written with k = m - y, the size of the b-th
child's subtree, every m at once is one max-plus product: out[m, k] = T[m-k][l][b-1] +
p_b * G[k][l-1], read through a strided (Toeplitz) view of the vector T[.][l][b-1], then an
argmax over k. One pass yields G(n, d) for every n <= budget and d <= max_depth.

Exact size bound (used when p is non-increasing, as measured vectors are): swapping two
children's subtrees so the larger one sits at the smaller rank never lowers the value, so
some optimal tree has child sizes non-increasing in rank at every node; then the b-th
child has at most (m - 1) / b nodes. Searching only k <= (m - 1) / b cuts the work from
~n^2 W / 2 to ~n^2 ln W per level and still finds an optimum. Unsorted p searches every k.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from redwood.errors import RedwoodError
from redwood.plan.formats import Acceptance, Profile, validate_p
from redwood.plan.tree import Tree, chain, specinfer, star

__all__ = ["DPTable", "dp_table", "optimal_tree", "reference_values", "Candidate",
           "TreeChoice", "choose_tree", "chain", "star", "specinfer"]


@dataclass
class DPTable:
    """Result of one DP pass. `values[n, d]` = G(n, d) (-inf where no tree fits: n > the
    nodes that d levels of width W can hold); index 0 rows/columns are unused."""

    p: np.ndarray                 # [W] acceptance vector used
    budget: int
    max_depth: int
    values: np.ndarray            # [budget + 1, max_depth + 1] float64, G(n, d)
    best_children: np.ndarray     # [max_depth + 1, budget + 1] int: argmax_b T[m][l][b]
    split: np.ndarray             # [max_depth + 1, W + 1, budget + 1] int: argmax_y of T[m][l][b]

    def feasible(self, n: int, d: int) -> bool:
        return 1 <= n <= self.budget and 1 <= d <= self.max_depth and np.isfinite(self.values[n, d])

    def expected_length(self, n: int, d: int) -> float:
        return float(self.values[n, d])

    def tree(self, n: int, d: int, source: dict | None = None) -> Tree:
        """Rebuild the argmax tree of G(n, d): BFS order, siblings in rank order."""
        if not self.feasible(n, d):
            raise RedwoodError(_infeasible_message(n, d, len(self.p)))
        parents = [-1]
        queue = [(0, n, d)]                      # (node index, subtree size, levels allowed)
        head = 0
        while head < len(queue):
            node, m, l = queue[head]
            head += 1
            for size in self._child_sizes(m, l):
                queue.append((len(parents), size, l - 1))
                parents.append(node)
        src = {"planner": "sequoia-dp", "budget": n, "max_depth": d,
               "p": [float(x) for x in self.p], "expected_length": self.expected_length(n, d)}
        src.update(source or {})
        return Tree(parents, source=src)

    def _child_sizes(self, m: int, l: int) -> list[int]:
        """Subtree sizes of the root's children, rank order, in the optimum of G(m, l)."""
        sizes = []
        b = int(self.best_children[l, m])
        while b > 0:
            y = int(self.split[l, b, m])         # first b-1 children + root take y nodes
            sizes.append(m - y)
            m, b = y, b - 1
        return sizes[::-1]


def dp_table(p, budget: int, max_depth: int, size_bound: bool = True) -> DPTable:
    """Run the DP once for every n <= budget and d <= max_depth (W = len(p)).

    size_bound: use the exact bound k <= (m - 1) / b when p is non-increasing (module doc);
    False searches every split, as the plain recurrence does (for benchmarks and tests).
    """
    p = _as_p(p)
    budget, max_depth = _check_size(budget, "budget"), _check_size(max_depth, "max_depth")
    N, D, W = budget, max_depth, len(p)
    bounded = size_bound and bool(np.all(np.diff(p) <= 0))
    values = np.full((D + 1, N + 1), -np.inf)    # G by level first: values[l, m]
    values[1:, 1] = 1.0                          # the root alone
    best_children = np.zeros((D + 1, N + 1), dtype=np.int32)
    split = np.zeros((D + 1, W + 1, N + 1), dtype=np.int32)
    m = np.arange(N + 1)
    work = _Workspace(N)
    for l in range(2, D + 1):
        sub = values[l - 1]                      # sub[k] = G(k, l-1), best child subtree of k nodes
        sub_exists = np.isfinite(sub)
        sub_or_zero = np.where(sub_exists, sub, 0.0)
        missing = np.where(sub_exists, 0.0, -np.inf)
        row = np.full(N + 1, -np.inf)            # T[.][l][0]: only the root alone
        row[1] = 1.0
        best = row.copy()
        for b in range(1, min(W, N - 1) + 1):
            # child_value[k] = p_b * G(k, l-1), -inf where no subtree (and no 0 * -inf = nan)
            child_value = p[b - 1] * sub_or_zero + missing
            kmax = (N - 1) // b if bounded else N - 1
            sizes, row = work.best_last_child(row, child_value, kmax, b + 1)
            split[l, b] = m - sizes              # y = nodes kept by the root and children < b
            better = row > best                  # strict: ties keep fewer children
            best = np.where(better, row, best)
            best_children[l][better] = b
        values[l] = best
    return DPTable(p=p, budget=N, max_depth=D, values=values.T.copy(),
                   best_children=best_children, split=split)


class _Workspace:
    """Buffers reused across the DP's (level, b) steps: one max-plus product per step.

    best_last_child: for every m >= first, k[m] = argmax over 1 <= k <= min(kmax, m - 1) of
    row[m - k] + child_value[k], and that value (k = 0 and -inf for m < first).
    window[m, t] = row[m - (kmax - t)] is a strided view (no copy) of `row` behind N
    entries of -inf; rows go in blocks small enough for the add and the argmax to share
    the CPU cache, and a block ending at row m1 reads only the columns with k <= m1 - 1.
    """

    BLOCK_ELEMENTS = 1 << 16      # rows per block * columns: 512 KiB of float64
    MIN_ROWS = 8

    def __init__(self, n: int):
        self.n = n
        self.padded = np.full(2 * n + 1, -np.inf)      # padded[n + j] = row[j]
        self.scratch = np.empty(max(self.BLOCK_ELEMENTS, self.MIN_ROWS * (n + 1)))
        self.index = np.arange(n + 1)

    def best_last_child(self, row, child_value, kmax, first):
        n, size, item = self.n, self.n + 1, self.padded.itemsize
        self.padded[n:] = row
        start = self.padded[n - kmax:]                   # window[m, t] = start[m + t]
        window = np.ndarray((size, kmax), dtype=np.float64, buffer=start,
                            strides=(item, item))
        tail = child_value[kmax:0:-1]                    # tail[t] = child_value[kmax - t]
        sizes = np.zeros(size, dtype=np.int64)
        value = np.full(size, -np.inf)
        rows = max(self.MIN_ROWS, self.BLOCK_ELEMENTS // max(kmax, 1))
        for m0 in range(first, size, rows):
            m1 = min(m0 + rows, size)
            t0 = max(0, kmax - (m1 - 1))                 # skip k > m1 - 1
            cols = kmax - t0
            block = self.scratch[: (m1 - m0) * cols].reshape(m1 - m0, cols)
            np.add(window[m0:m1, t0:], tail[None, t0:], out=block)   # [rows, k]: T + p_b G
            t = block.argmax(axis=1)
            value[m0:m1] = block.ravel()[self.index[: m1 - m0] * cols + t]
            sizes[m0:m1] = cols - t
        return sizes, value


def optimal_tree(p, budget: int, max_depth: int) -> Tree:
    """The tree with `budget` nodes (root included) and at most `max_depth` levels (root =
    level 1) that maximises expected tokens per step under acceptance vector p."""
    table = dp_table(p, budget, max_depth)
    return table.tree(table.budget, table.max_depth)


def reference_values(p, budget: int, max_depth: int) -> list[list[float]]:
    """The same recurrence with plain Python loops (the benchmark's yardstick and a test
    oracle). Returns G as nested lists, G[n][d], -inf where infeasible."""
    p = [float(x) for x in _as_p(p)]
    N, D, W = budget, max_depth, len(p)
    ninf = float("-inf")
    G = [[ninf] * (D + 1) for _ in range(N + 1)]
    for l in range(1, D + 1):
        G[1][l] = 1.0
    for l in range(2, D + 1):
        prev = [ninf] * (N + 1)                  # T[.][l][b-1], starting with b-1 = 0
        prev[1] = 1.0
        for b in range(1, W + 1):
            cur = [ninf] * (N + 1)
            pb = p[b - 1]
            for mm in range(2, N + 1):
                best = ninf
                for y in range(1, mm):
                    left, sub = prev[y], G[mm - y][l - 1]
                    if left == ninf or sub == ninf:
                        continue
                    v = left + pb * sub
                    if v > best:
                        best = v
                cur[mm] = best
                if best > G[mm][l]:
                    G[mm][l] = best
            prev = cur
    return G


# --- hardware-aware choice ---------------------------------------------------------------

@dataclass
class Candidate:
    """One (budget, depth) the hardware-aware choice compared. Times in milliseconds."""

    budget: int
    depth: int                  # levels of the DP tree (root = level 1)
    expected_length: float      # G(budget, depth): predicted tokens per step
    target_ms: float
    draft_ms: float | None      # None: a level is wider than any measured draft width
    step_ms: float | None
    tokens_per_second: float | None
    speedup: float | None       # over plain decoding, 1 token per t_target(1)


@dataclass
class TreeChoice:
    """What `choose_tree` picked, and every candidate it compared."""

    tree: Tree
    tokens_per_step: float
    speedup: float
    budget: int
    depth: int
    step_ms: float
    candidates: list[Candidate]
    table: DPTable = field(repr=False)


def step_draft_ms(tree: Tree, profile: Profile) -> float | None:
    """Draft time for one step: the draft runs once per level that has children (levels
    1..L-1 of an L-level tree), each costing `profile.draft_level_ms(width)`, i.e. the time
    measured at the nearest width at or above that level's width. None if a level is wider
    than every measured width."""
    total = 0.0
    for width in tree.level_sizes[:-1]:
        t = profile.draft_level_ms(width)
        if t is None:
            return None
        total += t
    return total


def choose_tree(p, profile, max_budget: int, max_depth: int) -> TreeChoice:
    """Pick (n, d) maximising G(n, d) / (t_target(n) + draft time of the DP tree).

    Only budgets the profile measured (n <= max_budget) are candidates: t_target(n) is never
    interpolated and need not be monotonic. A (n, d) whose DP tree uses fewer than d levels
    repeats the row of that smaller depth and is left out. Ties go to the smaller budget,
    then the smaller depth. See `step_draft_ms` for the draft's cost.
    """
    profile = _as_profile(profile)
    budgets = [n for n in sorted(profile.target_ms) if n <= _check_size(max_budget, "max_budget")]
    table = dp_table(p, max(budgets), max_depth)
    t1 = profile.target_ms[1]
    candidates, best, best_tree = [], None, None
    for n in budgets:
        for d in range(1, table.max_depth + 1):
            if not table.feasible(n, d):
                continue
            tree = table.tree(n, d)
            if tree.num_levels < d:              # same optimum as the (n, fewer levels) row
                continue
            cand = _candidate(tree, n, d, table.expected_length(n, d), profile, t1)
            candidates.append(cand)
            if cand.tokens_per_second is not None and (
                    best is None or cand.tokens_per_second > best.tokens_per_second):
                best, best_tree = cand, tree
    best_tree.source.update({"chosen_by": "choose_tree", "step_ms": best.step_ms,
                             "predicted_speedup": best.speedup})
    speculative = [c for c in candidates if c.budget > 1 and c.tokens_per_second is not None]
    if best.budget == 1 and speculative:       # say what plain decoding was chosen over
        top = max(speculative, key=lambda c: c.tokens_per_second)
        best_tree.source["best_rejected"] = {"budget": top.budget, "depth": top.depth,
                                             "predicted_speedup": top.speedup}
    return TreeChoice(tree=best_tree, tokens_per_step=best.expected_length, speedup=best.speedup,
                      budget=best.budget, depth=best.depth, step_ms=best.step_ms,
                      candidates=candidates, table=table)


def _candidate(tree, n, d, value, profile, t1) -> Candidate:
    target = profile.target_ms[n]
    draft = step_draft_ms(tree, profile)
    if draft is None:
        return Candidate(n, d, value, target, None, None, None, None)
    step = target + draft
    return Candidate(n, d, value, target, draft, step,
                     1000.0 * value / step, value * t1 / step)


# --- input checks ------------------------------------------------------------------------

def _as_p(p) -> np.ndarray:
    if isinstance(p, Acceptance):
        return p.p.copy()
    return validate_p(p)


def _as_profile(profile) -> Profile:
    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, dict):
        return Profile.from_dict(profile)
    if isinstance(profile, (str, Path)):
        return Profile.load(profile)
    raise RedwoodError("profile must be a Profile, a profile dict or a path to a profile JSON")


def _check_size(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise RedwoodError(f"{what} must be an integer >= 1, got {value!r}")
    return int(value)


def _infeasible_message(n: int, d: int, width: int) -> str:
    most = sum(width ** k for k in range(d))
    return (f"no tree of {n} nodes fits in {d} levels with at most {width} children per node "
            f"(at most {most} nodes); raise max_depth, lower the budget or give a longer p")


def best_speculative(choice: TreeChoice) -> tuple[Tree, float]:
    """(tree, expected tokens per step) of the fastest candidate that drafts at least one
    token: the choice itself when it speculates, else the best one it rejected (a hybrid
    drafter still wants the model's best tree, to weigh it against free drafts per step)."""
    if choice.budget > 1:
        return choice.tree, choice.tokens_per_step
    speculative = [c for c in choice.candidates if c.budget > 1 and c.tokens_per_second is not None]
    if not speculative:
        return choice.tree, choice.tokens_per_step
    top = max(speculative, key=lambda c: (c.tokens_per_second, -c.budget))
    tree = choice.table.tree(top.budget, top.depth)
    tree.source.update({"chosen_by": "best_speculative", "predicted_speedup": top.speedup})
    return tree, top.expected_length
