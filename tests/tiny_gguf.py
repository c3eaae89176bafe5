"""Tiny random GGUF causal LMs for llama.cpp tests (written in well under a second, no downloads).

`write_tiny_gguf(path, seed)` writes a 2-layer Qwen2-shaped model with float32 random weights and
a 512-token byte-level vocabulary (GPT-2 byte tokens, a few merges, control tokens, padding) that
llama.cpp loads like a real model. `write_tiny_gguf_pair(directory)` writes two with the same
vocabulary and different seeds (a target/draft pair). `write_perturbed_gguf(path, seed, noise)`
writes seed's model with relative noise on every weight: a draft that agrees with the target
often but not always. `write_non_causal_gguf` writes a metadata-only
file whose architecture is an encoder ('bert'), for the error tests.

The output head is scaled (`head_scale`) so the next-token logits spread over several units:
greedy comparisons between batched and one-token decodes are then far from ties.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = (("Ġ", "t"), ("h", "e"), ("i", "n"), ("Ġt", "he"), ("e", "r"), ("o", "n"),
          ("Ġ", "a"), ("r", "e"), ("a", "t"), ("e", "n"))


def byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode spelling of the 256 bytes, in byte order."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


def vocabulary(vocab: int = 512):
    """(tokens, token types, merges, eos id): bytes, merged tokens, control tokens, padding."""
    from gguf import TokenType

    tokens = byte_tokens()
    types = [TokenType.NORMAL] * len(tokens)
    for left, right in MERGES:
        tokens.append(left + right)
        types.append(TokenType.NORMAL)
    eos = len(tokens)
    for text in CONTROL_TOKENS:
        tokens.append(text)
        types.append(TokenType.CONTROL)
    if vocab < len(tokens):
        raise ValueError(f"vocab must be at least {len(tokens)}")
    for i in range(len(tokens), vocab):
        tokens.append(f"[PAD{i}]")
        types.append(TokenType.UNUSED)
    return tokens, types, [f"{a} {b}" for a, b in MERGES], eos


def write_tiny_gguf(path, seed: int, arch: str = "qwen2", vocab: int = 512, d_model: int = 64,
                    n_layers: int = 2, n_heads: int = 4, n_kv_heads: int = 2, d_ff: int = 128,
                    context: int = 4096, head_scale: float = 4.0, noise: float = 0.0,
                    noise_seed: int = 0) -> Path:
    """Write a random float32 causal LM in GGUF to `path`; same seed, same weights.
    noise > 0 adds noise * (the weight's own scale) * N(0, 1) to every random weight and bias,
    drawn from `noise_seed` (the base weights stay those of `seed`)."""
    import gguf

    if arch != "qwen2":
        raise ValueError("only the qwen2 layout is written (biases on q/k/v)")
    path = Path(path)
    rng = np.random.default_rng(seed)
    noise_rng = np.random.default_rng([seed, noise_seed])
    head_dim = d_model // n_heads

    def weight(rows, cols, scale=1.0):
        values = rng.standard_normal((rows, cols))
        if noise:
            values = values + noise * noise_rng.standard_normal((rows, cols))
        return (values * scale / np.sqrt(cols)).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(context)
    writer.add_embedding_length(d_model)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(d_ff)
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)

    tokens, types, merges, eos = vocabulary(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([int(t) for t in types])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(eos)
    writer.add_bos_token_id(eos)
    writer.add_add_bos_token(False)

    # [rows, cols] = PyTorch's [out, in]; gguf stores the reverse (ne0 = in) as llama.cpp wants.
    writer.add_tensor("token_embd.weight", weight(vocab, d_model, np.sqrt(d_model)))
    for i in range(n_layers):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(d_model, dtype=np.float32))
        writer.add_tensor(f"{blk}.attn_q.weight", weight(d_model, d_model))
        writer.add_tensor(f"{blk}.attn_q.bias", weight(1, d_model, 0.1).ravel())
        writer.add_tensor(f"{blk}.attn_k.weight", weight(n_kv_heads * head_dim, d_model))
        writer.add_tensor(f"{blk}.attn_k.bias", weight(1, n_kv_heads * head_dim, 0.1).ravel())
        writer.add_tensor(f"{blk}.attn_v.weight", weight(n_kv_heads * head_dim, d_model))
        writer.add_tensor(f"{blk}.attn_v.bias", weight(1, n_kv_heads * head_dim, 0.1).ravel())
        writer.add_tensor(f"{blk}.attn_output.weight", weight(d_model, d_model))
        writer.add_tensor(f"{blk}.ffn_norm.weight", np.ones(d_model, dtype=np.float32))
        writer.add_tensor(f"{blk}.ffn_gate.weight", weight(d_ff, d_model))
        writer.add_tensor(f"{blk}.ffn_up.weight", weight(d_ff, d_model))
        writer.add_tensor(f"{blk}.ffn_down.weight", weight(d_model, d_ff))
    writer.add_tensor("output_norm.weight", np.ones(d_model, dtype=np.float32))
    writer.add_tensor("output.weight", weight(vocab, d_model, head_scale))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_gguf_pair(directory, seeds=(0, 1), **kwargs) -> tuple[Path, Path]:
    """(target, draft): two tiny models with the same vocabulary and different seeds."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return tuple(write_tiny_gguf(directory / f"tiny-seed{seed}.gguf", seed, **kwargs)
                 for seed in seeds)


def write_perturbed_gguf(path, seed: int, noise: float, noise_seed: int = 1, **kwargs) -> Path:
    """Seed's tiny model with relative weight noise `noise` (see write_tiny_gguf): with the
    same vocabulary, a draft for the model of `seed` that agrees with it often."""
    return write_tiny_gguf(path, seed, noise=noise, noise_seed=noise_seed, **kwargs)


def write_non_causal_gguf(path, arch: str = "bert") -> Path:
    """A metadata-only GGUF whose architecture is an encoder (no tensors: it is rejected before
    llama.cpp would load it)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_bool(f"{arch}.attention.causal", False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


@pytest.fixture(scope="session")
def tiny_gguf_pair(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny GGUF pair, written once per test session (shared by the modules that import it:
    a second module finds the files already there)."""
    directory = tmp_path_factory.getbasetemp() / "tiny_gguf"
    target, draft = directory / "tiny-seed0.gguf", directory / "tiny-seed1.gguf"
    if not (target.is_file() and draft.is_file()):
        write_tiny_gguf_pair(directory)
    return target, draft
