"""The n-gram drafter's trees: the trie's nodes taken best-first within a requested tree's
limits, the kept part in BFS order, and the budget tree the drafter works within
(decode/ngram_drafter.py sizes each step)."""
from __future__ import annotations

import heapq
from collections.abc import Callable

from redwood.decode.ngram_index import TrieNode
from redwood.plan.tree import Tree, bfs_renumber


def tree_limits(tree: Tree) -> tuple[int, int, int]:
    """(nodes, leaves, depth in edges) of the requested tree: the proposal stays within them."""
    leaves = sum(1 for kids in tree.children if not kids)
    return len(tree), leaves, tree.num_levels - 1


def best_first(trie: list[TrieNode], rate: Callable[[int], float],
               limits: tuple[int, int, int],
               min_confidence: float = 0.0) -> tuple[list[int], list[float]]:
    """Take trie nodes in decreasing path value, each after its parent and its earlier siblings,
    within (max nodes, max leaves, max depth). Returns (taken node ids, their values).

    rate(node) = the node's c, asked once per node that becomes a candidate: a trie holds up
    to max_continuations x COPY_DEPTH nodes, most of them never candidates, and estimating
    every node was a third of the drafter's time per step. A candidate is the first child of a
    taken node or the next sibling of a taken node; a non-first sibling adds a leaf. `miss` =
    the value of reaching the parent and rejecting every earlier sibling, so value = miss · c.
    """
    max_nodes, max_leaves, max_depth = limits
    heap: list[tuple[float, int, float]] = []                   # (-value, node, miss)
    rates: dict[int, float] = {}

    def push(node: int, miss: float) -> None:
        if trie[node].depth > max_depth:
            return
        c = rates[node] = rate(node)
        if c >= min_confidence:
            heapq.heappush(heap, (-miss * c, node, miss))

    if trie[0].children:
        push(trie[0].children[0], 1.0)
    taken, values, leaves = [], [], 1
    while heap and len(taken) < max_nodes - 1:
        negative, node, miss = heapq.heappop(heap)
        item = trie[node]
        if item.rank > 1:
            if leaves >= max_leaves:
                continue
            leaves += 1
        taken.append(node)
        values.append(-negative)
        siblings = trie[item.parent].children
        if item.rank < len(siblings):
            push(siblings[item.rank], miss * (1.0 - rates[node]))
        if item.children:
            push(item.children[0], -negative)
    return taken, values


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
