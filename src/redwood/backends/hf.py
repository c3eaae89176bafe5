"""The transformers backend: one Hugging Face causal LM and its KV cache behind `Backend`.

Tentative tree nodes are appended to the cache in the order they are run; a 4D additive mask
lets each see the committed prefix and its own ancestors (docs/design.md §5). keep_path moves
the kept entries down in place (hf_cache.keep_tail). By default the cache is preallocated and
written by position (hf_cache.PreallocLayer) and masked attention uses grouped-query attention
without copying K/V heads (hf_attention); both are exact (docs/design.md §5.2).
"""
from __future__ import annotations

from typing import Sequence

import torch

from redwood.backends import hf_attention, hf_cache
from redwood.errors import RedwoodError
from redwood.plan.tree import Tree


class HFBackend:
    kind = "hf"
    fused_prefill_tree = True       # prefill_tree is one forward (the engine fuses, §5.4)

    def __init__(self, model, preallocate: bool = True, gqa_attention: bool = True):
        """preallocate: PreallocLayer cache instead of torch.cat DynamicCache. gqa_attention:
        switch a model on stock `sdpa` to `redwood_sdpa` (no repeat_kv; changes `model`'s
        config, outputs are bit-identical). Both False = the stock transformers path."""
        self.model = model.eval()
        if gqa_attention:
            hf_attention.use_gqa_attention(model)
        self.preallocate = preallocate
        self.device = model.device
        self.vocab_size = logits_width(model)
        self.max_positions = getattr(model.config, "max_position_embeddings", None) or None
        self.eos_ids = frozenset(eos_ids(model))
        self.name = (getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", "")
                     or type(model).__name__)
        self.dtype_name = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.cache = hf_cache.new_cache(model, preallocate)
        self._slots: dict[int, int] = {}     # tentative tree node -> offset after the prefix
        self._layouts: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    # -- Backend ---------------------------------------------------------------------------
    def reset(self) -> None:
        hf_cache.reset(self.cache)                               # preallocated buffers are reused
        self._slots = {}

    def cache_length(self) -> int:
        return hf_cache.cache_length(self.cache) - len(self._slots)

    def append(self, ids, rows: int = 1) -> torch.Tensor:
        if self._slots:
            raise RedwoodError("append with tentative tree nodes pending: call keep_path first")
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device).reshape(-1)
        if len(ids) == 0:
            return torch.empty(0, self.vocab_size, device=self.device)
        start = self.cache_length()
        positions = torch.arange(start, start + len(ids), device=self.device)
        logits = hf_cache.forward(self.model, ids, positions, self.cache, rows=max(rows, 1))
        return logits[len(logits) - rows:] if rows < len(logits) else logits

    def run_tree(self, tree: Tree, nodes: Sequence[int], tokens: torch.Tensor, root_position: int,
                 rows: Sequence[int] | None = None) -> torch.Tensor:
        ancestor, depths = self._layout(tree)
        nodes, prefix = list(nodes), self.cache_length()
        if not self._slots and nodes == list(range(len(tree))):
            visible = ancestor                                   # the whole tree: [n, n]
            index = slice(None)
        else:
            index = torch.tensor(nodes, device=self.device)
            for u in nodes:
                self._slots.setdefault(u, len(self._slots))
            cached = torch.tensor(list(self._slots), device=self.device)   # cache order
            visible = ancestor[index][:, cached]                 # [len(nodes), tentative]
        if isinstance(index, slice):
            for u in nodes:
                self._slots[u] = u
        mask = hf_cache.tree_attention_mask(prefix, visible, self.model.dtype)
        positions = root_position + depths[index]
        tokens = tokens.to(self.device)
        keep = 0 if rows is None else torch.as_tensor(list(rows), dtype=torch.long, device=self.device)
        return hf_cache.forward(self.model, tokens, positions, self.cache, mask, rows=keep)

    def prefill_tree(self, ids, tree: Tree, tokens: torch.Tensor) -> torch.Tensor:
        """One forward over cat(ids, tokens): ids causal at L.., the tree's nodes at
        L + len(ids) + depth, each seeing the cache, all of ids and its ancestors
        (hf_cache.prefill_tree_mask). Only the nodes' rows get logits [len(tree), V]: the
        output head is not run over the prompt."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device).reshape(-1)
        if len(ids) == 0:
            return self.run_tree(tree, range(len(tree)), tokens, self.cache_length())
        if self._slots:
            raise RedwoodError("prefill_tree with tentative tree nodes pending: call keep_path first")
        if len(tokens) != len(tree):
            raise RedwoodError(f"prefill_tree got a {len(tree)}-node tree but {len(tokens)} tokens")
        ancestor, depths = self._layout(tree)
        start, end = self.cache_length(), self.cache_length() + len(ids)
        positions = torch.cat([torch.arange(start, end, device=self.device), end + depths])
        mask = hf_cache.prefill_tree_mask(start, len(ids), ancestor, self.model.dtype)
        tokens = torch.cat([ids, tokens.to(device=self.device, dtype=torch.long).reshape(-1)])
        logits = hf_cache.forward(self.model, tokens, positions, self.cache, mask, rows=len(tree))
        self._slots = {u: u for u in range(len(tree))}           # node u at offset u after ids
        return logits

    def keep_path(self, nodes: Sequence[int]) -> None:
        prefix = self.cache_length()
        keep = torch.tensor([self._slots[u] for u in nodes], dtype=torch.long, device=self.device)
        hf_cache.keep_tail(self.cache, prefix, keep)
        self._slots = {}

    def room_needed(self, tree: Tree) -> int:
        return tree.num_levels                                   # positions, not cells, are bounded

    def check_tree(self, tree: Tree) -> None:
        return None                                              # no per-call limits

    # -- helpers ---------------------------------------------------------------------------
    def _layout(self, tree: Tree):
        """(ancestor-or-self [n, n] bool, depths [n] long) on the device, cached per shape."""
        key = tuple(tree.parents)
        if key not in self._layouts:
            if len(self._layouts) >= 256:                        # requests may bring their own trees
                self._layouts.clear()
            self._layouts[key] = (torch.as_tensor(tree.ancestor_mask(), device=self.device),
                                  torch.as_tensor(tree.depths, dtype=torch.long, device=self.device))
        return self._layouts[key]


def logits_width(model) -> int:
    """Rows of the output layer (= width of the logits); a dynamically quantised head
    exposes weight() as a method."""
    output = model.get_output_embeddings()
    weight = getattr(output, "weight", None) if output is not None else None
    if callable(weight):
        weight = weight()
    if weight is None:
        weight = model.get_input_embeddings().weight
    return int(weight.shape[0])


def eos_ids(model) -> set[int]:
    ids = getattr(model.generation_config, "eos_token_id", None) if model.generation_config else None
    if ids is None:
        ids = model.config.eos_token_id
    if ids is None:
        return set()
    return set(ids) if isinstance(ids, (list, tuple)) else {int(ids)}
