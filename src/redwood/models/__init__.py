"""Loading models: local Hugging Face directories and GGUF files, the shipped pair, CPU speed-ups.

Layers (each imports only those above it): manifest (cache integrity, stdlib only), threads,
hf_loading (transformers loading of local dirs / .gguf files), shipped (the shipped pair's
cache), pair (load_pair).
"""
_LAZY = {
    **{name: "redwood.models.hf_loading" for name in (
        "load_model", "load_tokenizer", "check_same_vocab", "resolve_dtype", "resolve_device",
        "hub_offline", "model_name", "forget_gguf_quantizer")},
    **{name: "redwood.models.threads" for name in ("configure_threads", "sensible_thread_count")},
    "shipped_pair_dirs": "redwood.models.shipped",
    "load_pair": "redwood.models.pair",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'redwood.models' has no attribute {name!r}")
