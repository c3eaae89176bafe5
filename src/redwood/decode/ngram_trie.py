"""The trie of an n-gram lookup's continuations (decode/ngram_index.py): what a drafter takes
its proposals from (decode/ngram_trees.py) and learns along (decode/ngram_drafter.py).

A lookup merges up to 8 continuations of up to 32 tokens each, ~120 nodes, while a step that
drafts nothing looks at a handful and the text walks a few more: making every node was a third
of a lookup's time. So `build_trie(..., lazy=True)` makes, below the point where a continuation
leaves the nodes before it, only its first node, holding the rest of its tokens; a node's
`children` grows its chain by one node when first read. The nodes that exist are then numbered
in the order they were read, not inserted, but the trie read through `children` is the same,
and `order` (the eager build's insertion order) breaks ties wherever a numbering would.

Pure python: no torch.
"""
from __future__ import annotations

from redwood.decode.ngram_index import Continuation

ORDER_DEPTH = 1 << 16      # order = continuation index * ORDER_DEPTH + depth: insertion order


class TrieNode:
    """One proposed token. depth: edges from the root (root 0); rank: 1-based among its
    siblings; match: the match length of the best continuation through it; near: that
    continuation is near the copy's source; edited: this token is the first one an edit rule
    changed in that continuation (where the rule may not hold); order: where the eager build
    inserts it (ties between equal values go to the smaller); own: that continuation occurred
    only in the answer itself (Continuation.own). children: the child node ids in rank order
    (grown on first read below a lazy chain's end)."""

    __slots__ = ("token", "parent", "depth", "rank", "match", "near", "edited", "order",
                 "own", "_children", "_rest")

    def __init__(self, token: int, parent: int, depth: int, rank: int, match: int,
                 children: list[int] | None = None, near: bool = False, edited: bool = False,
                 order: int = 0, own: bool = False):
        self.token, self.parent, self.depth, self.rank = token, parent, depth, rank
        self.match, self.near, self.edited, self.order = match, near, edited, order
        self.own = own
        self._children = [] if children is None else children
        self._rest = None        # (trie, this node's id, tokens, next index, edited_at)

    @property
    def children(self) -> list[int]:
        if self._rest is not None:
            self._grow()
        return self._children

    def _grow(self) -> None:
        """Make the next node of this node's chain (its only child so far)."""
        trie, me, tokens, i, edited_at = self._rest
        self._rest = None
        new = len(trie)
        child = TrieNode(tokens[i], me, self.depth + 1, 1, self.match, [], self.near,
                         edited_at == self.depth, self.order + 1, self.own)
        if i + 1 < len(tokens):
            child._rest = (trie, new, tokens, i + 1, edited_at)
        trie.append(child)
        self._children.append(new)

    def __repr__(self) -> str:
        return (f"TrieNode(token={self.token}, parent={self.parent}, depth={self.depth}, "
                f"rank={self.rank}, match={self.match})")


def build_trie(root: int, continuations: list[Continuation],
               lazy: bool = False) -> list[TrieNode]:
    """Merge continuations (best first) into a trie below `root`: node 0 is the root, and a
    node's children are the distinct next tokens in the rank order of the best continuation
    that reaches each. Eager (the default): nodes are numbered in insertion order (parents
    before children), not BFS order; a drafter renumbers the subtree it keeps. lazy: chains
    grow as they are read (module doc); parents still come before children."""
    nodes = [TrieNode(int(root), -1, 0, 0, 0, order=-1)]
    for index, continuation in enumerate(continuations):
        tokens, at, i = continuation.tokens, 0, 0
        while i < len(tokens):          # down the nodes an earlier continuation made
            nxt = next((c for c in nodes[at].children if nodes[c].token == tokens[i]), None)
            if nxt is None:
                break
            at, i = nxt, i + 1
        if i < len(tokens):             # the rest is a chain of new nodes, one child each
            _add_chain(nodes, at, tokens[i:], continuation, index * ORDER_DEPTH, lazy)
    return nodes


def _add_chain(nodes: list[TrieNode], at: int, tokens, continuation: Continuation,
               order: int, lazy: bool) -> None:
    """Append `tokens` below node `at` as a chain: the first a new last child of `at`, each
    next the only child of the one before; lazy: the first only, holding the rest."""
    match, near, edited_at = continuation.match, continuation.near, continuation.edited_at
    own = continuation.own
    parent = nodes[at]
    depth, rank = parent.depth, len(parent.children) + 1
    for i, token in enumerate(tokens):
        new = len(nodes)
        parent.children.append(new)
        parent = TrieNode(token, at, depth + 1, rank, match, [], near, edited_at == depth,
                          order + depth + 1, own)
        nodes.append(parent)
        if lazy and i + 1 < len(tokens):
            parent._rest = (nodes, new, tokens, i + 1, edited_at)
            return
        at, depth, rank = new, depth + 1, 1
