"""redwood.models (hf_loading, threads, pair): loading, dtype/device, vocab checks, error
messages, threads and load_pair (with tiny random models)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from redwood import models
from redwood.errors import RedwoodError


# --- tiny models -------------------------------------------------------------------

def tiny_causal_lm(arch="qwen2", vocab_size=64, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**config)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**config)).eval()


def save_tiny_tokenizer(directory: Path, vocab_size=64):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>") \
        .save_pretrained(str(directory))


def write_tiny_gguf(path: Path, model) -> Path:
    """Write a tiny Qwen2 model as an unquantised (F32) GGUF with a byte-level BPE tokenizer
    whose 64 tokens are a..z, aa..zz, aaa..jjj."""
    import gguf
    import numpy as np

    config = model.config
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    letters = "abcdefghijklmnopqrstuvwxyz"
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["<unk>", "<eos>"] + [letters[i % 26] * (1 + i // 26) for i in range(62)])
    writer.add_token_types([1] * 64)
    writer.add_token_merges([f"{c} {c}" for c in letters] + [f"{c}{c} {c}" for c in letters[:10]])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
    for name, tensor in model.state_dict().items():
        if name.startswith("model.layers."):          # model.layers.<i>.<module>.<weight|bias>
            layer, rest = name.split(".", 3)[2:]
            module, kind = rest.rsplit(".", 1)
            names[name] = f"blk.{layer}.{per_layer[module]}.{kind}"
        writer.add_tensor(names[name], tensor.numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def tiny_dir(tmp_path):
    """A saved tiny Qwen2 model + tokenizer; returns (dir, the in-memory model)."""
    model = tiny_causal_lm("qwen2")
    directory = tmp_path / "tiny-qwen2"
    model.save_pretrained(str(directory))
    save_tiny_tokenizer(directory)
    return directory, model


INPUT = torch.tensor([[3, 5, 7, 11, 13]])


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_load_model_round_trip(tmp_path, arch):
    original = tiny_causal_lm(arch, seed=1)
    original.save_pretrained(str(tmp_path))
    loaded = models.load_model(tmp_path)
    assert not loaded.training
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in loaded.parameters())
    assert type(loaded) is type(original)
    with torch.no_grad():
        torch.testing.assert_close(loaded(INPUT).logits, original(INPUT).logits, rtol=0, atol=0)


def test_load_gguf_file(tmp_path):
    original = tiny_causal_lm("qwen2", seed=7)
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf", original)
    loaded = models.load_model(gguf_path)
    assert not hasattr(loaded.config, "quantization_config") and not loaded.training
    with torch.no_grad():
        torch.testing.assert_close(loaded(INPUT).logits, original(INPUT).logits, rtol=0, atol=0)
    tokenizer = models.load_tokenizer(gguf_path)
    assert tokenizer("abbccc").input_ids == [2, 29, 56]           # a, bb, ccc
    # a directory holding exactly one .gguf works too, and a loaded GGUF model can be saved
    same = models.load_model(tmp_path, dtype="float64")
    assert next(same.parameters()).dtype == torch.float64
    loaded.save_pretrained(str(tmp_path / "saved"))
    resaved = models.load_model(tmp_path / "saved")
    with torch.no_grad():
        torch.testing.assert_close(resaved(INPUT).logits, original(INPUT).logits, rtol=0, atol=0)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_weights_are_copied_out_of_the_file_mapping(tmp_path):
    """Loaded weights must not stay backed by the mapped safetensors file (the kernel could
    evict them under memory pressure); tied weights stay tied and values are unchanged."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(2)
    original = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2, tie_word_embeddings=True)).eval()
    original.save_pretrained(str(tmp_path))
    loaded = models.load_model(tmp_path)
    with open("/proc/self/maps") as maps:
        assert str(tmp_path / "model.safetensors") not in maps.read()
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    for (name, a), b in zip(loaded.state_dict().items(), original.state_dict().values()):
        assert torch.equal(a, b), name
    with torch.no_grad():
        torch.testing.assert_close(loaded(INPUT).logits, original(INPUT).logits, rtol=0, atol=0)


@pytest.mark.parametrize("dtype,expected", [("bfloat16", torch.bfloat16), ("fp16", torch.float16),
                                            (torch.float64, torch.float64)])
def test_load_model_dtype(tiny_dir, dtype, expected):
    directory, original = tiny_dir
    loaded = models.load_model(directory, dtype=dtype)
    assert {p.dtype for p in loaded.parameters()} == {expected}
    with torch.no_grad():
        # the cast model still computes the same function, to the precision of its dtype
        tol = {torch.float64: 1e-5, torch.bfloat16: 0.1, torch.float16: 0.02}[expected]
        torch.testing.assert_close(loaded(INPUT).logits.float(), original(INPUT).logits,
                                   rtol=0, atol=tol)


def test_bad_dtype_and_device_are_user_errors(tiny_dir):
    directory, _ = tiny_dir
    with pytest.raises(RedwoodError, match="unknown dtype 'int3'"):
        models.load_model(directory, dtype="int3")
    with pytest.raises(RedwoodError, match="unknown device"):
        models.load_model(directory, device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(RedwoodError, match="CUDA is not available"):
            models.load_model(directory, device="cuda")
    assert models.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_missing_path_says_what_to_do(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(RedwoodError) as info:
        models.load_model(missing)
    message = str(info.value)
    assert str(missing) in message and "does not exist" in message
    assert "make models" in message and "\n" not in message
    with pytest.raises(RedwoodError, match="does not exist"):
        models.load_tokenizer(missing)


def test_directory_without_weights_or_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RedwoodError, match="not a model directory"):
        models.load_model(tmp_path / "empty")
    only_config = tmp_path / "config-only"
    tiny_causal_lm().config.save_pretrained(str(only_config))
    with pytest.raises(RedwoodError, match="no weights"):
        models.load_model(only_config)
    (tmp_path / "weights.txt").write_text("x")
    with pytest.raises(RedwoodError, match="not a .gguf"):
        models.load_model(tmp_path / "weights.txt")


def test_corrupt_weights_are_a_user_error(tiny_dir):
    directory, _ = tiny_dir
    weights = directory / "model.safetensors"
    weights.write_bytes(b"\x00" * 7 + weights.read_bytes()[7:100])   # header destroyed + truncated
    with pytest.raises(RedwoodError, match="could not load the model in .*fetch them again"):
        models.load_model(directory)


def test_check_same_vocab_names_both_models(tmp_path):
    big, small = tiny_causal_lm(vocab_size=64), tiny_causal_lm(vocab_size=48)
    big.save_pretrained(str(tmp_path / "big"))
    small.save_pretrained(str(tmp_path / "small"))
    target, draft = models.load_model(tmp_path / "big"), models.load_model(tmp_path / "small")
    assert models.check_same_vocab(target, models.load_model(tmp_path / "big")) == 64
    with pytest.raises(RedwoodError) as info:
        models.check_same_vocab(target, draft)
    message = str(info.value)
    assert str(tmp_path / "big") in message and str(tmp_path / "small") in message
    assert "64" in message and "48" in message


def test_check_same_vocab_compares_logit_width():
    target, draft = tiny_causal_lm(vocab_size=64), tiny_causal_lm(vocab_size=64)
    draft.resize_token_embeddings(72)       # padded embedding: config says 72 now too
    draft.config.vocab_size = 64            # ...but pretend the config was not updated
    with pytest.raises(RedwoodError, match="72 logits"):
        models.check_same_vocab(target, draft)


def test_load_pair_from_directories(tmp_path, tiny_dir):
    directory, original = tiny_dir
    tiny_causal_lm(seed=5).save_pretrained(str(tmp_path / "draft"))
    target, draft, tokenizer = models.load_pair(target=directory, draft=tmp_path / "draft")
    # the tokenizer is the target directory's (transformers picks the class from config.json)
    assert tokenizer.convert_tokens_to_ids(["w3", "w5"]) == [3, 5] and tokenizer.eos_token == "<eos>"
    with torch.no_grad():
        torch.testing.assert_close(target(INPUT).logits, original(INPUT).logits, rtol=0, atol=0)
        assert not torch.equal(draft(INPUT).logits, target(INPUT).logits)
    tiny_causal_lm(vocab_size=40).save_pretrained(str(tmp_path / "other"))
    with pytest.raises(RedwoodError, match="vocabularies differ.* 64 .* 40"):
        models.load_pair(target=directory, draft=tmp_path / "other")
    (tmp_path / "other" / "model.safetensors").unlink()      # refused before loading weights
    with pytest.raises(RedwoodError, match="vocabularies differ"):
        models.load_pair(target=directory, draft=tmp_path / "other")
    with pytest.raises(RedwoodError, match="both --target and --draft"):
        models.load_pair(target=directory)
    with pytest.raises(RedwoodError, match="unknown model pair 'nope'.*qwen2.5-coder"):
        models.load_pair("nope")


def test_hub_is_never_contacted():
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    import huggingface_hub.constants
    assert huggingface_hub.constants.HF_HUB_OFFLINE


def test_configure_threads_respects_user_choice(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("REDWOOD_THREADS", "1")
        assert models.configure_threads(force=True) == 1 and torch.get_num_threads() == 1
        torch.set_num_threads(2)
        assert models.configure_threads() == 2      # once configured, the caller's choice stands
        monkeypatch.delenv("REDWOOD_THREADS")
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert 1 <= models.sensible_thread_count() <= os.cpu_count()
    finally:
        torch.set_num_threads(before)


@pytest.mark.real
def test_shipped_pair_writes_code(shipped_pair):
    """The shipped pair loads, shares one vocabulary, and both models continue a code prompt
    sensibly (greedy): the body of a Python function with a return statement."""
    target, draft, tokenizer = shipped_pair
    assert models.check_same_vocab(target, draft) == 151936 >= len(tokenizer)
    prompt = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    for model in (target, draft):
        assert next(model.parameters()).dtype == torch.float32 and not model.training
        with torch.inference_mode():
            out = model.generate(prompt, max_new_tokens=48, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id,
                                 stop_strings=["return"], tokenizer=tokenizer)
        text = tokenizer.decode(out[0, prompt.shape[1]:])
        assert "return" in text, text
