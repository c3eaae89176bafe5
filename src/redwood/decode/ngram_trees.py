"""The n-gram drafter's trees: the trie's nodes taken best-first within a requested tree's
limits, the kept part in BFS order, and the budget tree the drafter works within
(decode/ngram_drafter.py sizes each step)."""
from __future__ import annotations

import heapq
from collections.abc import Callable

from redwood.decode.ngram_trie import TrieNode
from redwood.plan.tree import Tree, bfs_renumber


def tree_limits(tree: Tree) -> tuple[int, int, int]:
    """(nodes, leaves, depth in edges) of the requested tree: the proposal stays within them."""
    leaves = sum(1 for kids in tree.children if not kids)
    return len(tree), leaves, tree.num_levels - 1


def best_first(trie: list[TrieNode], rate: Callable[[int], float],
               limits: tuple[int, int, int], min_confidence: float = 0.0,
               pays: tuple[list[tuple[int, float]], float] | None = None,
               ) -> tuple[list[int], list[float]]:
    """Take trie nodes in decreasing path value, each after its parent and its earlier siblings,
    within (max nodes, max leaves, max depth). Returns (taken node ids, their values).

    rate(node) = the node's c, asked once per node that becomes a candidate: a trie holds up
    to max_continuations x COPY_DEPTH nodes, most of them never candidates, and estimating
    every node was a third of the drafter's time per step. A candidate is the first child of a
    taken node or the next sibling of a taken node; a non-first sibling adds a leaf. `miss` =
    the value of reaching the parent and rejecting every earlier sibling, so value = miss · c.
    Equal values go in the trie's insertion order (TrieNode.order), however it is numbered.

    pays = (sizes, scale): stop once no tree of a size still to come could be predicted faster
    than a plain step (`could_pay`), so a step where nothing pays takes a few nodes, not the
    whole budget. sizes: [(n, t(n) / t(1) - 1)] of the measured sizes, ascending; scale: the
    most the caller may multiply the values by. The taken prefix is the same with or without
    it: only nodes that no tree the caller can choose would hold are left untaken.
    """
    max_nodes, max_leaves, max_depth = limits
    heap: list[tuple[float, int, int, float]] = []       # (-value, order, node, miss)
    rates: dict[int, float] = {}

    def push(node: int, miss: float) -> None:
        if trie[node].depth > max_depth:
            return
        c = rates[node] = rate(node)
        if c >= min_confidence:
            heapq.heappush(heap, (-miss * c, trie[node].order, node, miss))

    if trie[0].children:
        push(trie[0].children[0], 1.0)
    taken, values, leaves, total = [], [], 1, 0.0
    while heap and len(taken) < max_nodes - 1:
        if pays is not None and not could_pay(pays, len(taken), total, _reach(heap)):
            break
        negative, _, node, miss = heapq.heappop(heap)
        item = trie[node]
        if item.rank > 1:
            if leaves >= max_leaves:
                continue
            leaves += 1
        taken.append(node)
        values.append(-negative)
        total -= negative
        siblings = trie[item.parent].children
        if item.rank < len(siblings):
            push(siblings[item.rank], miss * (1.0 - rates[node]))
        if item.children:
            push(item.children[0], -negative)
    return taken, values


def _reach(heap: list[tuple[float, int, int, float]]) -> float:
    """The highest value any node still to be taken can have. An entry's own value is
    miss · c, its descendants' at most that, its later siblings' at most miss · (1 - c); every
    node not yet taken is one of those of some entry."""
    return max(max(-negative, miss + negative) for negative, _, _, miss in heap)


def could_pay(pays: tuple[list[tuple[int, float]], float], taken: int, total: float,
              reach: float) -> bool:
    """Whether some measured size n > taken + 1 could give E(n) / t(n) > 1 / t(1): with
    `taken` nodes worth `total` so far and every further node worth at most `reach`, scaled by
    up to `scale`, E(n) <= 1 + scale · (total + (n - 1 - taken) · reach)."""
    sizes, scale = pays
    for n, extra in sizes:                     # extra = t(n) / t(1) - 1
        if n > taken + 1 and scale * (total + (n - 1 - taken) * reach) > extra:
            return True
    return False


def bfs_subtree(trie: list[TrieNode], keep: set[int]) -> tuple[list[int], list[int]]:
    """The root plus the kept nodes in BFS order with siblings in rank order:
    (parents list for redwood.plan.tree.Tree, trie node of each tree node)."""
    order, parents = [0], [-1]
    for i in range(len(trie)):                  # `order` grows while we walk it
        if i >= len(order):
            break
        for child in trie[order[i]].children:
            if child in keep:
                order.append(child)
                parents.append(i)
    return parents, order


def ngram_budget_tree(depth: int = 16, branches: int = 8, branch_depth: int = 2) -> Tree:
    """The limits an n-gram drafter works within, as a tree for the engine's checks: one
    chain `depth` deep (long copies) plus `branches - 1` short side chains (other
    continuations). Only its node count, leaf count and depth matter to NgramDrafter; the
    per-step size comes from its cost model."""
    parents = [-1] + list(range(depth - 1))                  # the main chain: nodes 0..depth-1
    level1 = []
    for _ in range(branches - 1):                            # side children of the root
        parents.append(0)
        level1.append(len(parents) - 1)
    for _ in range(branch_depth - 1):
        nxt = []
        for u in level1:
            parents.append(u)
            nxt.append(len(parents) - 1)
        level1 = nxt
    return Tree(bfs_renumber(parents)[0],
                {"kind": "ngram budget", "depth": depth, "branches": branches})
