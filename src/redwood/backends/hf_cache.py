"""KV-cache and attention-mask helpers for Hugging Face models (transformers 5.x).

The engine keeps one `DynamicCache` per model. Tree tokens are appended to the
cache in breadth-first order; after verification only the accepted path is kept.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def keep_tail(cache: DynamicCache, start: int, keep: torch.Tensor) -> None:
    """Keep positions [0, start) plus `start + keep` (in that order); drop the rest.

    keep: [k] long offsets into the tail that starts at `start` (sorted, distinct).
    The kept entries are moved down in place and the cache is cut to a view, so the
    cost is O(k), not O(context).
    """
    k = len(keep)
    contiguous = bool((keep == torch.arange(k, device=keep.device)).all())
    for layer in cache.layers:
        for name in ("keys", "values"):
            full = getattr(layer, name)                     # [batch, kv_heads, length, head_dim]
            if not contiguous:                              # a chain's path needs no moving
                full[:, :, start:start + k] = full.index_select(2, keep + start)
            setattr(layer, name, full[:, :, :start + k])


def crop(cache: DynamicCache, length: int) -> None:
    """Drop every position at or after `length`."""
    excess = cache_length(cache) - length
    if excess > 0:
        cache.crop(-excess)


def tree_attention_mask(prefix_length: int, visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D mask for new tokens that see the whole cached prefix plus `visible`.

    visible: [q, k] bool, which of the k newest cache entries (the new tokens and any
    tree tokens appended earlier in this step) each of the q new tokens may attend to.
    Returns [1, 1, q, prefix_length + k] with 0 where visible and dtype-min elsewhere.
    """
    q = visible.shape[0]
    prefix = torch.ones(q, prefix_length, dtype=torch.bool, device=visible.device)
    allowed = torch.cat([prefix, visible], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=visible.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def forward(model, token_ids: torch.Tensor, positions: torch.Tensor, cache: DynamicCache,
            mask: torch.Tensor | None = None, rows: torch.Tensor | int = 0) -> torch.Tensor:
    """One forward of new tokens over the cache; returns logits [len(rows), V].

    token_ids, positions: [q] long. mask: [1, 1, q, kv] additive or None for causal.
    rows: which of the q positions need logits (a [r] long tensor), or an int
    counting the last positions (0 = all). Skipping rows skips their share of the
    output head, which for a 150k vocabulary is a large part of a small model's cost.
    """
    out = model(input_ids=token_ids[None], position_ids=positions[None], attention_mask=mask,
                cache=cache, use_cache=True, logits_to_keep=rows)
    return out.logits[0]
