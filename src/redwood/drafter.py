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
from redwood.tree import Tree


@dataclass
class Proposal:
    tokens: torch.Tensor               # [n] long, token of every drafted node (tokens[0] = root)
    draft_probs: torch.Tensor | None   # [n, V] float32 draft law at nodes with children (sampling only)
    layout: TreeLayout                 # the tree drafted: the requested one, or a pruned subtree of it
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

    @staticmethod
    def confidence(logits: torch.Tensor, probs: torch.Tensor | None,
                   children: torch.Tensor) -> torch.Tensor:
        """The draft's probability of each chosen child [m, k]: under the sampling law when
        sampling, under the raw softmax (temperature 1) when greedy."""
        if probs is None:
            probs = torch.softmax(logits.float(), dim=-1)
        return probs.gather(1, children)


class DraftModelDrafter:
    """Proposes trees with a small causal LM, drafting level by level.

    Cache invariant between steps: the cache holds every committed token except
    `pending` (accepted tokens the draft has not run yet) and the current root.
    Within a step, only nodes that get children are run by the draft, in level
    order; `slots` maps each of them to its offset after the root in the cache.
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

    def propose(self, root: int, layout: TreeLayout, choose: ChildChooser,
                min_confidence: float = 0.0, layout_of=None) -> Proposal:
        """Draft the tree below `root`, one draft forward per level that has children.

        min_confidence > 0 prunes as it goes: a node gets its children only if the draft gave
        every token on the path to it, its own included, a probability of at least
        min_confidence. (Products of those probabilities, tried first, stopped too early: the
        target agrees with the draft more often than the draft's probabilities say.) The
        decision uses only the draft's own numbers, taken before the node's children are
        drawn, so every verifier stays exact.
        `layout_of(tree)` returns the (cached) TreeLayout of a pruned subtree.
        """
        device, tree = self.model.device, layout.tree
        start = self.clock()
        base_tokens = torch.tensor(self.pending + [root], device=device)
        offset = kvcache.cache_length(self.cache)
        positions = torch.arange(offset, offset + len(base_tokens), device=device)
        logits = kvcache.forward(self.model, base_tokens, positions, self.cache, rows=1)
        self.base = offset + len(base_tokens)          # cache length up to and including the root
        self.pending, self.slots = [], {}

        n = len(tree)
        tokens = torch.empty(n, dtype=torch.long, device=device)
        tokens[0] = root
        alive = [True] + [False] * (n - 1)
        path_confidence = [1.0] * n                    # lowest draft probability on the path
        holder: dict = {}                              # lazily allocated draft_probs [n, V]
        expanding, forwards = [0], 1
        while True:
            confidences = self._assign_children(tree, expanding, logits, tokens, choose, n,
                                                holder, min_confidence > 0)
            next_level = []
            for row, u in enumerate(expanding):
                for j, kid in enumerate(tree.children[u]):
                    alive[kid] = True
                    if confidences is not None:
                        path_confidence[kid] = min(path_confidence[u], confidences[row][j])
                    if tree.children[kid] and path_confidence[kid] >= min_confidence:
                        next_level.append(kid)
            if not next_level:
                break
            logits = self._forward_level(layout, tokens, next_level)
            expanding, forwards = next_level, forwards + 1
        kept = [u for u in range(n) if alive[u]]
        self.node_ids = kept
        probs = holder.get("probs")
        if len(kept) < n:                              # pruned: renumber the surviving subtree
            index = {u: i for i, u in enumerate(kept)}
            parents = [-1] + [index[tree.parents[u]] for u in kept[1:]]
            layout = layout_of(Tree(parents, {"kind": "pruned", "from": len(tree)}))
            rows = torch.tensor(kept, device=device)
            tokens = tokens[rows]
            probs = None if probs is None else probs[rows]
        return Proposal(tokens, probs, layout, self.clock() - start, forwards)

    def _forward_level(self, layout, tokens, nodes: list[int]) -> torch.Tensor:
        """Run `nodes` (one level) through the draft over the root and earlier levels' nodes."""
        device = self.model.device
        for u in nodes:
            self.slots[u] = len(self.slots)
        rows = torch.tensor(nodes, device=device)
        cached = torch.tensor(list(self.slots), device=device)    # tree nodes in cache order
        visible = layout.ancestor[rows][:, cached]                # [len(nodes), len(slots)]
        mask = kvcache.tree_attention_mask(self.base, visible, self.model.dtype)
        positions = self.base - 1 + layout.depths[rows]
        return kvcache.forward(self.model, tokens[rows], positions, self.cache, mask)

    @staticmethod
    def _assign_children(tree, nodes, logits, tokens, choose, n, holder, want_confidence):
        """Pick children for `nodes` (which all have children) from their logits [m, V].
        Returns the draft probability of each child (list of lists) when asked."""
        k = max(len(tree.children[u]) for u in nodes)
        children, probs = choose(logits, k)
        if probs is not None:
            if "probs" not in holder:
                holder["probs"] = torch.empty(n, probs.shape[-1], dtype=torch.float32, device=probs.device)
            holder["probs"][nodes] = probs
        for row, u in enumerate(nodes):
            kids = tree.children[u]
            tokens[kids[0]:kids[-1] + 1] = children[row, :len(kids)]
        if not want_confidence:
            return None
        return choose.confidence(logits, probs, children).tolist()

    def commit(self, path: list[int], tokens: torch.Tensor) -> None:
        """Keep the accepted path's KV. path: node indices of the proposal (path[0] = root,
        already cached at base - 1); tokens: the proposal's tokens."""
        nodes = [self.node_ids[i] for i in path]
        cached = [self.slots[u] for u in nodes[1:] if u in self.slots]
        keep = torch.tensor(cached, dtype=torch.long, device=self.model.device)
        kvcache.keep_tail(self.cache, self.base, keep)
        self.pending = [int(tokens[i]) for i, u in zip(path[1:], nodes[1:]) if u not in self.slots]
