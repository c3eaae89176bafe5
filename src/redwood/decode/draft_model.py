"""`DraftModelDrafter`: proposes trees with a small causal LM on any `Backend`, level by level."""
from __future__ import annotations

import torch

from redwood.decode.drafter import ChildChooser, Proposal
from redwood.decode.layout import LayoutCache, TreeLayout
from redwood.plan.tree import Tree


class DraftModelDrafter:
    """Cache invariant between steps: the backend holds every committed token except
    `pending` (accepted tokens the draft has not run yet) and the current root. Within a
    step the root is committed first, then only nodes that get children are run, one
    backend call per level (tentative nodes, kept by `commit` when on the accepted path)."""

    def __init__(self, backend, clock, layouts: LayoutCache | None = None, growth=None):
        self.backend = backend
        self.clock = clock                      # callable returning seconds (syncs CUDA)
        self.layouts = layouts or LayoutCache(backend.device)
        self.pending: list[int] = []
        self.growth = growth                    # decode.tree_growth.BestFirstGrowth or None

    reuse_prefix = True        # the engine sets it per request (its cache_prompt option)

    def prefill(self, prompt_ids: torch.Tensor) -> None:
        """Run the prompt on the draft, keeping the longest prefix its cache already holds
        (backends with keep_prefix, when reuse_prefix) so a multi-turn chat runs only its new
        tokens on the draft too."""
        self.pending = []
        if self.reuse_prefix and hasattr(self.backend, "keep_prefix"):
            kept = self.backend.keep_prefix(prompt_ids)
        else:
            self.backend.reset()
            kept = 0
        if len(prompt_ids) > kept:
            self.backend.append(prompt_ids[kept:], rows=0)

    def propose(self, root: int, layout: TreeLayout, choose: ChildChooser,
                min_confidence: float = 0.0) -> Proposal:
        """Draft the tree below `root`, one draft forward per level that has children.

        min_confidence > 0 prunes as it goes: a node gets its children only if the draft gave
        every token on the path to it, its own included, a probability of at least
        min_confidence. (Products of those probabilities, tried first, stopped too early: the
        target agrees with the draft more often than the draft's probabilities say.) The
        decision uses only the draft's own numbers, taken before the node's children are
        drawn, so every verifier stays exact (docs/design.md §4).
        """
        tree, backend = layout.tree, self.backend
        start = self.clock()
        logits = backend.append(self.pending + [root], rows=1)          # [1, V]
        self.root_position = backend.cache_length() - 1
        self.pending, self.ran = [], set()

        n = len(tree)
        tokens = torch.empty(n, dtype=torch.long, device=backend.device)
        tokens[0] = root
        alive = [True] + [False] * (n - 1)
        path_confidence = [1.0] * n                    # lowest draft probability on the path
        holder: dict = {}                              # lazily allocated draft_probs [n, V]
        expanding, forwards = [0], 1
        if self.growth is not None:
            forwards = self._grow(tree, logits, tokens, choose, holder, alive)
            expanding = []
        while expanding:
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
            logits = backend.run_tree(tree, next_level, tokens[next_level], self.root_position)
            self.ran.update(next_level)
            expanding, forwards = next_level, forwards + 1
        self.tree = tree
        kept = [u for u in range(n) if alive[u]]
        self.node_ids = kept
        probs = holder.get("probs")
        if len(kept) < n:                              # pruned: renumber the surviving subtree
            index = {u: i for i, u in enumerate(kept)}
            parents = [-1] + [index[tree.parents[u]] for u in kept[1:]]
            layout = self.layouts(Tree(parents, {"kind": "pruned", "from": len(tree)}))
            rows = torch.tensor(kept, device=tokens.device)
            tokens = tokens[rows]
            probs = None if probs is None else probs[rows]
        return Proposal(tokens, probs, layout, None, self.clock() - start, forwards)

    def _grow(self, tree, logits, tokens, choose, holder, alive) -> int:
        """Level by level inside `tree`, the children each node keeps and the nodes expanded
        next are the growth rule's (decode/tree_growth.py); returns the draft forwards run."""
        growth, expanding, forwards = self.growth, [0], 1
        growth.begin(0.0 if choose.greedy else choose.temperature)
        while expanding:
            q = choose.law(logits)                                          # [m, V] float32
            widest = max(len(tree.children[u]) for u in expanding)
            top = q.topk(min(widest, q.shape[-1]), dim=-1).values.tolist()
            counts = growth.child_counts(expanding, top, [len(tree.children[u]) for u in expanding])
            if not any(counts):
                break
            self._assign_children(tree, expanding, logits, tokens, choose, len(tree), holder,
                                  False, k=max(counts), law=q)
            kept = []
            for row, u in enumerate(expanding):
                kids = tree.children[u][:counts[row]]
                for kid in kids:
                    alive[kid] = True
                growth.add_children(u, kids, q[row, tokens[kids]].tolist() if kids else [])
                kept += [kid for kid in kids if tree.children[kid]]
            expanding = growth.to_expand(kept)
            if expanding:
                expanding.sort()                      # BFS order within the level
                logits = self.backend.run_tree(tree, expanding, tokens[expanding],
                                               self.root_position)
                self.ran.update(expanding)
                growth.ran_level(len(expanding))
                forwards += 1
        return forwards

    @staticmethod
    def _assign_children(tree, nodes, logits, tokens, choose, n, holder, want_confidence,
                         k=None, law=None):
        """Pick children for `nodes` (which all have children) from their logits [m, V]:
        k per node (default: the most any of them has in `tree`; a node keeps its first
        ones); law: the rows' law if already computed (ChildChooser.law). Returns the draft
        probability of each child (list of lists) when asked."""
        k = k or max(len(tree.children[u]) for u in nodes)
        children, probs = choose(logits, k, law)
        if probs is not None:
            if "probs" not in holder:
                holder["probs"] = torch.empty(n, probs.shape[-1], dtype=torch.float32, device=probs.device)
            holder["probs"][nodes] = probs
        for row, u in enumerate(nodes):
            kids = tree.children[u][:k]
            tokens[kids[0]:kids[-1] + 1] = children[row, :len(kids)].to(tokens.device)
        if not want_confidence:
            return None
        return choose.confidence(logits, probs, children).tolist()

    def commit(self, path: list[int], tokens: torch.Tensor) -> None:
        """Keep the accepted path's cache entries; accepted nodes the draft never ran (they
        had no children to draft) become `pending`, run at the start of the next step."""
        nodes = [self.node_ids[i] for i in path]
        self.backend.keep_path([u for u in nodes[1:] if u in self.ran])
        self.pending = [int(tokens[i]) for i, u in zip(path[1:], nodes[1:]) if u not in self.ran]

    def skip(self, root: int) -> None:
        """A plain target step consumed `root`: the draft runs it with the next proposal."""
        self.pending.append(int(root))
