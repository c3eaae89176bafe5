"""Drafting sources: something that proposes a tree of candidate tokens.

A drafter owns whatever state it needs (for a draft model, its KV cache) and
follows three calls per generation: `prefill(prompt)`, then per step
`propose(root, layout, chooser)` and `commit(path)`. One class per source; the
draft model is the only source today.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from redwood import kvcache
from redwood.layout import TreeLayout


@dataclass
class Proposal:
    tokens: torch.Tensor               # [n] long, token of every tree node (tokens[0] = root)
    draft_probs: torch.Tensor | None   # [n, V] float32 draft law at nodes with children (sampling only)
    draft_seconds: float = 0.0
    draft_forwards: int = 0


class ChildChooser:
    """How children are picked from draft logits: greedy top-k, or sampled from the
    processed draft distribution (with or without replacement)."""

    def __init__(self, greedy: bool, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 replacement: bool = False, generator: torch.Generator | None = None):
        self.greedy, self.temperature, self.top_k, self.top_p = greedy, temperature, top_k, top_p
        self.replacement, self.generator = replacement, generator

    def __call__(self, logits: torch.Tensor, k: int):
        """logits [m, V] -> (children [m, k] long, draft probs [m, V] float32 or None)."""
        from redwood.sampling import greedy_children, process_logits, propose_children

        if self.greedy:
            return greedy_children(logits, k), None
        probs = process_logits(logits, self.temperature, self.top_k, self.top_p)
        return propose_children(probs, k, self.replacement, self.generator), probs


class DraftModelDrafter:
    """Proposes trees with a small causal LM, drafting level by level.

    Cache invariant between steps: the cache holds every committed token except
    `pending` (accepted tokens the draft has not run yet) and the current root.
    """

    def __init__(self, model, clock):
        self.model = model
        self.clock = clock                      # callable returning seconds (syncs CUDA)
        self.cache = None
        self.pending: list[int] = []

    def prefill(self, prompt_ids: torch.Tensor) -> None:
        """prompt_ids: [L] long, all tokens before the first root (may be empty)."""
        self.cache = kvcache.new_cache(self.model)
        self.pending = []
        if len(prompt_ids):
            positions = torch.arange(len(prompt_ids), device=prompt_ids.device)
            kvcache.forward(self.model, prompt_ids, positions, self.cache, rows=1)

    def propose(self, root: int, layout: TreeLayout, choose: ChildChooser) -> Proposal:
        """Draft the whole tree below `root`: one draft forward per level that has children."""
        device, tree = self.model.device, layout.tree
        start = self.clock()
        base_tokens = torch.tensor(self.pending + [root], device=device)
        offset = kvcache.cache_length(self.cache)
        positions = torch.arange(offset, offset + len(base_tokens), device=device)
        root_logits = kvcache.forward(self.model, base_tokens, positions, self.cache, rows=1)
        self.base = offset + len(base_tokens)          # cache length up to and including the root
        self.pending = []

        n = len(tree)
        tokens = torch.empty(n, dtype=torch.long, device=device)
        tokens[0] = root
        holder: dict = {}                              # lazily allocated draft_probs [n, V]
        self._assign_children(tree, [0], root_logits, tokens, choose, n, holder)
        # Levels 1 .. L-2 have children somewhere; the last level is never run by the draft.
        for level in layout.levels[1:-1]:
            first, last = level.first, level.last
            visible = layout.ancestor[first:last, 1:last]       # sees tree nodes 1 .. last-1
            mask = kvcache.tree_attention_mask(self.base, visible, self.model.dtype)
            positions = self.base - 1 + layout.depths[first:last]
            logits = kvcache.forward(self.model, tokens[first:last], positions, self.cache, mask,
                                     level.parent_rows)
            self._assign_children(tree, level.parents, logits, tokens, choose, n, holder)
        self.forwarded = layout.first_leaf_level_node
        forwards = max(len(layout.levels) - 1, 1)
        return Proposal(tokens, holder.get("probs"), self.clock() - start, forwards)

    @staticmethod
    def _assign_children(tree, nodes, logits, tokens, choose, n, holder):
        """Pick children for `nodes` (which all have children) from their logits [m, V]."""
        k = max(len(tree.children[u]) for u in nodes)
        children, probs = choose(logits, k)
        if probs is not None:
            if "probs" not in holder:
                holder["probs"] = torch.empty(n, probs.shape[-1], dtype=torch.float32, device=probs.device)
            holder["probs"][nodes] = probs
        for row, u in enumerate(nodes):
            kids = tree.children[u]
            tokens[kids[0]:kids[-1] + 1] = children[row, :len(kids)]

    def commit(self, path: list[int], tokens: torch.Tensor) -> None:
        """Keep the accepted path's KV; path[0] is the root (already cached at base - 1)."""
        cached = [u - 1 for u in path[1:] if u < self.forwarded]
        keep = torch.tensor(cached, dtype=torch.long, device=self.model.device)
        kvcache.keep_tail(self.cache, self.base, keep)
        self.pending = [int(tokens[u]) for u in path[1:] if u >= self.forwarded]
