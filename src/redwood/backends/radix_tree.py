"""A radix tree of token sequences, for the prefix cache: which cached sequence shares the
longest prefix with a new prompt (SGLang's RadixAttention indexes its KV cache the same way).

Each owner (a hashable id: the lane whose cells hold the sequence) inserts one sequence. Edges
carry runs of tokens (a node with one child is never split until a second sequence diverges
there), and every node records the owners whose sequence runs through it, so a lookup walks
at most len(prompt) tokens however many sequences are cached and returns the owners sharing
the longest prefix. Pure python; no llama.cpp.
"""
from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np


class _Node:
    __slots__ = ("edge", "children", "owners")

    def __init__(self, edge: tuple[int, ...] = ()):
        self.edge = edge                          # the tokens on the edge into this node
        self.children: dict[int, _Node] = {}      # first token of the child's edge -> child
        self.owners: set = set()                  # owners whose sequence covers this node


class RadixTree:
    """owner -> token sequence, with longest-prefix lookup over all of them."""

    def __init__(self):
        self._root = _Node()
        self._sequences: dict[Hashable, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self._sequences)

    def __contains__(self, owner) -> bool:
        return owner in self._sequences

    def sequence(self, owner) -> tuple[int, ...]:
        return self._sequences[owner]

    def insert(self, owner, tokens: Sequence[int]) -> None:
        """Index `tokens` under `owner` (replacing what the owner had)."""
        if owner in self._sequences:
            self.remove(owner)
        tokens = tuple(int(t) for t in tokens)
        self._sequences[owner] = tokens
        node, i = self._root, 0
        node.owners.add(owner)
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                child = node.children[tokens[i]] = _Node(tokens[i:])
            else:
                k = common_prefix(child.edge, tokens[i:])
                if k < len(child.edge):
                    child = self._split(node, child, k)
            child.owners.add(owner)
            node, i = child, i + len(child.edge)

    def remove(self, owner) -> None:
        """Forget the owner's sequence; nodes no sequence covers any more are dropped."""
        tokens = self._sequences.pop(owner)
        node, i = self._root, 0
        node.owners.discard(owner)
        while i < len(tokens):
            child = node.children[tokens[i]]
            child.owners.discard(owner)
            if not child.owners:
                del node.children[tokens[i]]          # its whole subtree was the owner's alone
                return
            node, i = child, i + len(child.edge)

    def longest_prefix(self, tokens: Sequence[int]) -> tuple[int, frozenset]:
        """(length, owners): the longest prefix of `tokens` some indexed sequence starts with,
        and every owner whose sequence starts with it (length 0: every owner)."""
        node, i = self._root, 0
        while i < len(tokens):
            child = node.children.get(int(tokens[i]))
            if child is None:
                break
            k = common_prefix(child.edge, tokens[i:i + len(child.edge)])
            if k < len(child.edge):
                return i + k, frozenset(child.owners)
            node, i = child, i + k
        return i, frozenset(node.owners)

    @staticmethod
    def _split(parent: _Node, child: _Node, k: int) -> _Node:
        """Cut child's edge after k tokens: parent -> middle (edge[:k]) -> child (edge[k:])."""
        middle = _Node(child.edge[:k])
        middle.owners = set(child.owners)
        child.edge = child.edge[k:]
        middle.children[child.edge[0]] = child
        parent.children[middle.edge[0]] = middle
        return middle


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share. Long runs compare in numpy (a cached
    conversation is thousands of tokens), short ones in python."""
    n = min(len(a), len(b))
    if n < 64:
        k = 0
        while k < n and a[k] == b[k]:
            k += 1
        return k
    differ = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(differ[0]) if len(differ) else n
