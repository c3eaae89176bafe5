"""The n-gram drafter's best-first walk (decode/ngram_trees.py): stopping once no size could pay
(`pays`) leaves every choice the drafter can make as it was, and takes few nodes where nothing
pays; build_trie's chains; the drafter's lookups with and without the stop agree."""
from __future__ import annotations

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from redwood.decode.layout import TreeLayout
from redwood.decode.ngram_drafter import COPY_DEPTH, NgramDrafter
from redwood.decode.ngram_index import Continuation
from redwood.decode.ngram_trie import build_trie
from redwood.decode.ngram_trees import best_first, ngram_budget_tree, tree_limits


def best_n(values: list[float], table: dict[int, float], max_nodes: int, scale: float) -> int:
    """The size NgramDrafter.best_size picks (margin 0) on values scaled by `scale`."""
    expected, best, chosen = 1.0, 1.0 / table[1], 1
    for n in range(2, min(max_nodes, len(values) + 1) + 1):
        expected += scale * values[n - 2]
        if n in table and expected / table[n] > best:
            chosen, best = n, expected / table[n]
    return chosen


def random_trie(rng: random.Random, continuations: int, length: int):
    ranked = [Continuation(tuple(rng.randrange(4) for _ in range(rng.randint(1, length))),
                           rng.randint(1, 40), 1, -i) for i in range(continuations)]
    return build_trie(9, ranked)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 10 ** 6), continuations=st.integers(1, 8),
       length=st.integers(1, 20), max_nodes=st.integers(2, 40), max_leaves=st.integers(1, 8),
       scale=st.floats(0.05, 1.5), steep=st.floats(0.05, 1.2))
def test_stopping_where_nothing_pays_changes_no_choice(seed, continuations, length, max_nodes,
                                                       max_leaves, scale, steep):
    rng = random.Random(seed)
    trie = random_trie(rng, continuations, length)
    rates = {u: rng.random() for u in range(len(trie))}
    # measured sizes with t(n) = 1 + steep * (n - 1) * noise: steep or flat, not smooth
    table = {1: 1.0}
    for n in sorted(rng.sample(range(2, 49), 12)):
        table[n] = 1.0 + steep * (n - 1) * rng.uniform(0.5, 1.5)
    limits = (max_nodes, max_leaves, length)
    full_taken, full_values = best_first(trie, rates.get, limits)
    sizes = [(n, t - 1.0) for n, t in sorted(table.items()) if 1 < n <= max_nodes]
    taken, values = best_first(trie, rates.get, limits, pays=(sizes, scale))
    assert taken == full_taken[:len(taken)] and values == full_values[:len(values)]
    for s in (scale, scale * 0.5, min(1.0, scale)):   # the unscaled choice and any smaller scale
        assert best_n(values, table, max_nodes, s) == best_n(full_values, table, max_nodes, s)


def test_where_nothing_pays_only_a_few_nodes_are_taken():
    # 8 continuations of 30 tokens, every node kept half the time, on a CPU where t(n) grows
    # nearly as fast as n: no tree pays, and the walk stops after a handful of nodes.
    rng = random.Random(0)
    trie = build_trie(9, [Continuation(tuple(rng.randrange(50) for _ in range(30)), 2, 1, -i)
                          for i in range(8)])
    table = {n: 1.0 + 0.8 * (n - 1) for n in (1, 2, 3, 4, 8, 16, 32)}
    sizes = [(n, t - 1.0) for n, t in table.items() if n > 1]
    full, _ = best_first(trie, lambda u: 0.5, (48, 8, 31))
    few, values = best_first(trie, lambda u: 0.5, (48, 8, 31), pays=(sizes, 1.0))
    assert len(full) == 47 and len(few) <= 4
    assert best_n(values, table, 48, 1.0) == 1
    # where a copy pays (every node kept 0.97 of the time) the walk goes past the best size
    full, full_values = best_first(trie, lambda u: 0.97, (48, 8, 31))
    copy, values = best_first(trie, lambda u: 0.97, (48, 8, 31), pays=(sizes, 1.0))
    chosen = best_n(values, table, 48, 1.0)
    assert chosen == best_n(full_values, table, 48, 1.0) > 1
    assert chosen <= len(copy) < len(full)


def canonical(trie, at: int = 0):
    """The trie below node `at` as nested tuples, read through `children` (ids left out)."""
    node = trie[at]
    return (node.token, node.depth, node.rank, node.match, node.near, node.edited, node.order,
            tuple(canonical(trie, c) for c in node.children))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10 ** 6), continuations=st.integers(0, 8), length=st.integers(1, 12))
def test_a_lazy_trie_reads_as_the_eager_one(seed, continuations, length):
    rng = random.Random(seed)
    ranked = [Continuation(tuple(rng.randrange(3) for _ in range(rng.randint(1, length))),
                           rng.randint(1, 9), 1, -i, near=rng.random() < 0.3,
                           edited_at=rng.choice([None, 0, 1, 2])) for i in range(continuations)]
    eager, lazy = build_trie(7, ranked), build_trie(7, ranked, lazy=True)
    assert len(lazy) <= len(eager)
    assert canonical(lazy) == canonical(eager)
    assert len(lazy) == len(eager)                          # reading it grew every node
    assert all(lazy[c].parent == u for u in range(len(lazy)) for c in lazy[u].children)
    assert all(node.parent < u for u, node in enumerate(lazy) if u)


def test_chains_are_single_children_below_the_branch_point():
    trie = build_trie(1, [Continuation((4, 5, 6, 7), 3, 1, 9, edited_at=2),
                          Continuation((4, 5, 8, 9), 2, 1, 5)])
    assert [n.token for n in trie] == [1, 4, 5, 6, 7, 8, 9]
    assert [n.parent for n in trie] == [-1, 0, 1, 2, 3, 2, 5]
    assert [n.children for n in trie] == [[1], [2], [3, 5], [4], [], [6], []]
    assert [(n.depth, n.rank, n.match) for n in trie[1:]] == [
        (1, 1, 3), (2, 1, 3), (3, 1, 3), (4, 1, 3), (3, 2, 2), (4, 1, 2)]
    assert [n.edited for n in trie] == [False, False, False, True, False, False, False]
    lazy = build_trie(1, [Continuation((4, 5, 6, 7), 3, 1, 9), Continuation((4, 5, 8, 9), 2, 1, 5)],
                      lazy=True)
    assert [n.token for n in lazy] == [1, 4, 5, 6, 8]      # 7 and 9 wait below 6 and 8


def test_a_drafter_that_stops_early_proposes_what_one_that_does_not_would():
    # Two drafters on one text and one steep profile; one's lookups take every node (as in a
    # batch sized jointly), the other's stop where nothing pays: their proposals are equal.
    steep = {1: 10.0, 2: 17.0, 3: 24.0, 4: 29.0, 8: 80.0, 16: 100.0, 32: 174.0}
    rng = random.Random(3)
    block = [rng.randrange(30) for _ in range(60)]
    text = block + [rng.randrange(30) for _ in range(40)] + block[:50]
    budget = TreeLayout.build(ngram_budget_tree(depth=COPY_DEPTH), "cpu")
    limits = tree_limits(budget.tree)
    pruned, full = NgramDrafter(target_ms=steep), NgramDrafter(target_ms=steep)
    for drafter in (pruned, full):
        drafter.prefill(torch.tensor(text[:20]))
    drafted = 0
    for at in range(20, len(text)):
        picks = []
        for drafter, alone in ((pruned, True), (full, False)):
            trie, taken, values = drafter.lookup(text[at], limits, True, alone=alone)
            n, _ = drafter.best_size(values, limits[0])
            picks.append([trie[u].token for u in taken[:n - 1]])
            drafter.commit_tokens([])
        assert picks[0] == picks[1]
        drafted += bool(picks[0])
    assert drafted > 10                        # the copy of `block` was drafted
