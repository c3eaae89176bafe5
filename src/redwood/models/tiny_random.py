"""Tiny random model pairs built in-process (no files, no downloads), for `--quick` runs
and tests: the whole profile -> calibrate -> tune pipeline runs in seconds on them.

`tiny_pair`: a draft that is the target's first layer (cheaper, usually agrees), like a real
pair. `perturbed_copy`: a draft equal to the target but for a noisy output head, whose
acceptance can be computed exactly from the two distributions (tests).
"""
from __future__ import annotations

import copy

import torch

QUICK_VOCAB = 96


def tiny_model(vocab_size: int = QUICK_VOCAB, seed: int = 0, hidden_size: int = 32,
               num_layers: int = 2, max_positions: int = 1024, scale: float = 1.0,
               dtype: torch.dtype = torch.float32):
    """A randomly initialised Qwen2 causal LM in eval mode. `scale` multiplies the output
    head: > 1 gives sharper next-token distributions (more like a trained LM)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size,
                         intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, tie_word_embeddings=False,
                         bos_token_id=0, eos_token_id=1, pad_token_id=None)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    torch.random.set_rng_state(generator_state)     # leave the caller's global RNG alone
    return model.to(dtype).eval().requires_grad_(False)


def perturbed_copy(model, noise: float, seed: int = 1):
    """A deep copy of `model` with N(0, noise^2 * mean square of the head) added to its output
    head: the copy's next-token law differs from the original's by an amount set by `noise`."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head = draft.lm_head.weight
        spread = head.float().pow(2).mean().sqrt()
        head.add_((torch.randn(head.shape, generator=generator) * spread * noise).to(head.dtype))
    return draft


def tiny_pair(vocab_size: int = QUICK_VOCAB, seed: int = 0, num_layers: int = 6,
              hidden_size: int = 64, scale: float = 4.0, deep_weight: float = 0.2,
              dtype: torch.dtype = torch.float32):
    """(target, draft) shaped like a real pair: the draft is cheaper and usually agrees.

    The target has `num_layers` layers whose layers after the first write to the residual
    stream with weight `deep_weight` (their output projections are scaled); the draft is the
    target cut to its first layer (same embeddings, norm and head), so it runs ~1/num_layers
    of the layers and predicts a slightly different, correlated distribution.
    """
    target = tiny_model(vocab_size=vocab_size, seed=seed, hidden_size=hidden_size,
                        num_layers=num_layers, scale=scale, dtype=dtype)
    with torch.no_grad():
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(deep_weight)
            layer.mlp.down_proj.weight.mul_(deep_weight)
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:1]
    draft.config.num_hidden_layers = 1
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:1]
    return target, draft


def random_prompts(count: int, vocab_size: int = QUICK_VOCAB, length: int = 12,
                   seed: int = 0) -> list[torch.Tensor]:
    """`count` prompts of `length` random token ids (ids 2.. so none is BOS or EOS)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab_size, (length,), generator=generator) for _ in range(count)]
