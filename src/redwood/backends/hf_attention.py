"""Grouped-query attention for masked tree forwards without copying K/V heads.

Stock transformers' `sdpa` attention (5.x, CPU) calls `repeat_kv` whenever a mask is given and
more than one query is run: every forward copies each layer's whole K and V cache from
kv_heads to num_heads heads ([1, kv_heads, kv, d] -> [1, heads, kv, d]; 6x for Qwen2.5-1.5B's
2 KV / 12 query heads) before attending. A tree verify always has a mask and q > 1, so it pays
that copy in every layer. `redwood_sdpa` (registered through transformers' AttentionInterface,
selected per model with `set_attn_implementation`) instead hands the unrepeated K/V to torch's
`scaled_dot_product_attention(enable_gqa=True)`, which indexes the shared head in the kernel.
On torch 2.13 CPU this gives bit-identical outputs to the repeat_kv path (tests/test_hf_cache.py).
Every other case (one query, no grouping, no mask, extras like position bias) goes to stock sdpa.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

NAME = "redwood_sdpa"


def gqa_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                     scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """The AttentionInterface signature. query [B, heads, q, d]; key, value [B, kv_heads, kv, d];
    attention_mask [B or 1, 1, q, kv] additive/bool. Returns ([B, q, heads, d], None) as stock."""
    groups = getattr(module, "num_key_value_groups", 1)
    plain = (kwargs.get("position_bias") is None and kwargs.get("softcap") is None
             and not kwargs.get("output_attentions", False) and kwargs.get("sliding_window") is None)
    if groups == 1 or query.shape[2] == 1 or attention_mask is None or not plain:
        # one query: stock already folds the groups into the query axis (pack_gqa); no mask:
        # stock already passes enable_gqa; anything unusual: stock's handling is authoritative.
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=False, enable_gqa=True)                       # [B, heads, q, d]
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make `redwood_sdpa` a valid attn_implementation; its masks are built exactly as sdpa's."""
    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, gqa_sdpa_forward)
    if NAME not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def use_gqa_attention(model) -> bool:
    """Switch a model running stock `sdpa` to `redwood_sdpa`; leave any other choice (eager,
    flash, ...) alone. True if the model now runs redwood_sdpa."""
    current = getattr(model.config, "_attn_implementation", None)
    if current == NAME:
        return True
    if current != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    register()
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME


def use_stock_attention(model) -> None:
    """Undo use_gqa_attention (for A/B measurements)."""
    if getattr(model.config, "_attn_implementation", None) == NAME:
        model.set_attn_implementation("sdpa")
