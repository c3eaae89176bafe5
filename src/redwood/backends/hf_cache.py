"""KV-cache and attention-mask helpers for Hugging Face models (transformers 5.x).

The engine keeps one cache per model: a `DynamicCache` whose full-attention layers are
`PreallocLayer`s (preallocated buffers written by position) unless asked for the stock
concatenating layers. Tree tokens are appended to the cache in breadth-first order; after
verification only the accepted path is kept (keep_tail).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 256            # positions preallocated at first use; doubles when outgrown


class PreallocLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are views [B, kv_heads, length, d] of buffers
    [B, kv_heads, capacity, d]: each forward writes its new K/V at positions length..length+q-1
    instead of torch.cat-ing the whole cache into a fresh tensor (stock DynamicLayer copies
    O(context) bytes per layer per forward). Capacity doubles when outgrown (amortised O(1)).

    Views, not buffers, are what transformers and crop() see, so DynamicLayer's crop and
    get_seq_length work unchanged; in-place writes go to the buffers only, which are made
    outside inference mode so one cache serves both inference_mode and no_grad callers.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._stores: tuple[torch.Tensor, torch.Tensor] | None = None
        self.keys = self.values = None
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states, value_states: [B, kv_heads, q, d]. Returns the views [B, kv_heads, L+q, d]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if not self._owns_views(key_states, value_states):
            self._adopt(key_states, value_states)           # first use, or someone swapped views
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self._stores[0].shape[-2]:
            self._grow(end)
        keys, values = self._stores
        keys[:, :, start:end].copy_(key_states)
        values[:, :, start:end].copy_(value_states)
        self.keys, self.values = keys[:, :, :end], values[:, :, :end]
        return self.keys, self.values

    def keep_tail(self, start: int, keep: torch.Tensor, contiguous: bool) -> None:
        """Keep positions [0, start) + (start + keep); see hf_cache.keep_tail. keep: [k] long."""
        if self.keys is None:
            return
        end = start + len(keep)
        for store in self._stores:
            if not contiguous:                               # writes go to the buffer, not a view
                store[:, :, start:end] = store.index_select(2, keep + start)
        self.keys, self.values = self._stores[0][:, :, :end], self._stores[1][:, :, :end]

    def reset(self) -> None:
        """Empty the layer but keep its buffers: the next sequence reuses them."""
        if self.is_initialized and self._stores is not None:
            self.keys, self.values = self._stores[0][:, :, :0], self._stores[1][:, :, :0]

    # -- helpers -------------------------------------------------------------------------------
    def _owns_views(self, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        stores = self._stores
        return (stores is not None and self.keys is not None
                and _same_start(self.keys, stores[0]) and _same_start(self.values, stores[1])
                and stores[0].shape[:2] == key_states.shape[:2]
                and stores[0].dtype == key_states.dtype and stores[1].dtype == value_states.dtype)

    def _adopt(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """New buffers holding whatever keys/values the layer has now (none at first use)."""
        empty = self.keys is None or self.keys.numel() == 0
        old = (None, None) if empty else (self.keys, self.values)
        length = 0 if empty else self.keys.shape[-2]
        self._stores = tuple(_buffer(like, length + key_states.shape[-2]) for like in (key_states, value_states))
        for store, data in zip(self._stores, old):
            if data is not None:
                store[:, :, :length].copy_(data)
        self.keys, self.values = self._stores[0][:, :, :length], self._stores[1][:, :, :length]

    def _grow(self, needed: int) -> None:
        length = self.keys.shape[-2]
        grown = []
        for store in self._stores:
            bigger = _buffer(store, max(needed, 2 * store.shape[-2]))
            bigger[:, :, :length].copy_(store[:, :, :length])
            grown.append(bigger)
        self._stores = tuple(grown)
        self.keys, self.values = grown[0][:, :, :length], grown[1][:, :, :length]


def _same_start(view: torch.Tensor, store: torch.Tensor) -> bool:
    """view is store[:, :, :length] (data_ptr alone is unreliable for an empty view)."""
    return (view.untyped_storage().data_ptr() == store.untyped_storage().data_ptr()
            and view.storage_offset() == store.storage_offset() and view.stride() == store.stride())


def _buffer(like: torch.Tensor, needed: int) -> torch.Tensor:
    """Uninitialised [B, heads, capacity, d] shaped after `like` [B, heads, *, d]; capacity is
    needed rounded up to a power of two, at least MIN_CAPACITY."""
    capacity = max(MIN_CAPACITY, 1 << max(needed - 1, 0).bit_length())
    batch, heads, _, dim = like.shape
    with torch.inference_mode(False):                      # a normal tensor: writable in any mode
        return torch.empty(batch, heads, capacity, dim, dtype=like.dtype, device=like.device)


def new_cache(model, preallocate: bool = True) -> DynamicCache:
    """One model's cache; preallocate=False gives the stock torch.cat DynamicCache (A/B)."""
    cache = DynamicCache(config=model.config)
    if preallocate:
        # only plain full-attention layers: sliding-window layers keep their own logic
        cache.layers = [PreallocLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def reset(cache: DynamicCache) -> None:
    """Drop every position; preallocated layers keep their buffers."""
    for layer in cache.layers:
        layer.reset()


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
        if isinstance(layer, PreallocLayer):
            layer.keep_tail(start, keep, contiguous)
            continue
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


def prefill_tree_mask(cached: int, prefix: int, ancestor: torch.Tensor,
                      dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D mask for one forward of `prefix` new prompt tokens followed by a tree of n
    nodes, after `cached` committed entries (HFBackend.prefill_tree).

    ancestor: [n, n] bool, ancestor-or-self. Queries are the prefix tokens then the nodes; keys
    are the cached entries, the prefix tokens, then the nodes:
      prefix row i: every cached entry, prefix tokens 0..i (causal), no node;
      node row u:   every cached entry, every prefix token, its ancestors and itself.
    Returns [1, 1, prefix + n, cached + prefix + n] with 0 where visible and dtype-min elsewhere.
    """
    n, device = ancestor.shape[0], ancestor.device
    causal = torch.ones(prefix, prefix, dtype=torch.bool, device=device).tril()       # [p, p]
    hidden = torch.zeros(prefix, n, dtype=torch.bool, device=device)                  # [p, n]
    seen = torch.ones(n, prefix, dtype=torch.bool, device=device)                     # [n, p]
    visible = torch.cat([torch.cat([causal, hidden], dim=1),
                         torch.cat([seen, ancestor], dim=1)])                         # [p+n, p+n]
    return tree_attention_mask(cached, visible, dtype)


def forward(model, token_ids: torch.Tensor, positions: torch.Tensor, cache: DynamicCache,
            mask: torch.Tensor | None = None, rows: torch.Tensor | int = 0) -> torch.Tensor:
    """One forward of new tokens over the cache; returns logits [len(rows), V].

    token_ids, positions: [q] long. mask: [1, 1, q, kv] additive or None for causal.
    rows: which of the q positions need logits (a [r] long tensor), or an int
    counting the last positions (0 = all). Skipping rows skips their share of the
    output head, which for a 150k vocabulary is a large part of a small model's cost.
    No autograd graph: a cache written in place must not chain every forward's graph.
    """
    with torch.no_grad():
        out = model(input_ids=token_ids[None], position_ids=positions[None], attention_mask=mask,
                    cache=cache, use_cache=True, logits_to_keep=rows)
    return out.logits[0]
