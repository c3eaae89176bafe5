"""`ShadowDrafts`: what the n-gram drafter's unscaled best tree would have kept, every step.

The drafter scales each step's predicted drafted tokens by kept / predicted (the draft ratio,
decode/ngram_acceptance.py). Learnt from the drafted steps alone, that ratio is a trap: a few
bad drafts push it down, the scaled trees stop paying, nothing is drafted, and nothing it could
learn from is drafted again (in a replay, a whole-file edit that one early mismatch talked out
of drafting ran 0.99x instead of 1.22x). So every step that has a tree the unscaled estimates
would choose records it as a *shadow*: its node set and the tokens it predicts kept (E(n) - 1).
The emitted text then walks it: the shadow keeps each node the text follows, and resolves when
the text leaves its node set; the ratio observes (predicted, kept). The text decides, drafted
or not: for a point-mass node the target emits its token with probability p(token) whether it
was proposed or not (the module doc of decode/ngram_drafter.py), so the observation is the same
in law, and the ratio keeps learning while the drafter proposes nothing.

Pure python: no torch.
"""
from __future__ import annotations

from redwood.decode.ngram_trie import TrieNode


class ShadowDrafts:
    """Pending shadows [trie, greedy, node set, predicted, at node, kept], resolved into
    `observe(greedy, predicted, kept)` as the text walks them. Each resolves within its depth
    in tokens, so at most one per step of the last COPY_DEPTH tokens is pending."""

    def __init__(self, observe):
        self.observe = observe
        self.pending: list[list] = []

    def add(self, trie: list[TrieNode], greedy: bool, nodes: list[int], predicted: float) -> None:
        """A step's unscaled best tree: `nodes` (trie ids, closed under parents), predicting
        `predicted` drafted tokens kept. An empty tree (a plain step) is no observation."""
        if nodes:
            self.pending.append([trie, greedy, frozenset(nodes), float(predicted), 0, 0])

    def follow(self, tokens: list[int]) -> None:
        """The text went on with `tokens`: advance every shadow, resolve those it left."""
        self.pending = [shadow for shadow in self.pending if self._walk(shadow, tokens)]

    def _walk(self, shadow: list, tokens: list[int]) -> bool:
        trie, greedy, nodes, predicted, at, kept = shadow
        for token in tokens:
            at = next((c for c in trie[at].children if c in nodes and trie[c].token == token),
                      None)
            if at is None:
                self.observe(greedy, predicted, kept)
                return False
            kept += 1
        shadow[4], shadow[5] = at, kept
        if not any(c in nodes for c in trie[at].children):     # followed to a leaf: all kept
            self.observe(greedy, predicted, kept)
            return False
        return True
