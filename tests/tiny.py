"""Tiny random Hugging Face causal LMs for tests (seconds to build, no downloads)."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM


def tiny_model(arch: str = "qwen2", vocab_size: int = 64, seed: int = 0,
               dtype: torch.dtype = torch.float32, hidden_size: int = 32,
               num_layers: int = 2, max_positions: int = 512, scale: float = 1.0):
    """A randomly initialised model; `scale` multiplies the output head so the
    next-token distribution is sharper (scale > 1) or flatter (scale < 1)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=max_positions, tie_word_embeddings=False,
                  bos_token_id=0, eos_token_id=1, pad_token_id=None)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(arch)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model.to(dtype).eval()
