"""Which runtime runs the models, and loading a pair on it.

`--backend auto` (the default): llama.cpp for GGUF files and for the shipped pair on a CPU
(the assembled GGUF files: no float cache, ~1.6 GB of RAM instead of ~10 GB), transformers for
Hugging Face directories and for CUDA. On llama.cpp the models are `Backend`s; on transformers
they are models (the engine, profile and calibrate wrap them in the transformers backend).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from redwood.errors import RedwoodError

BACKENDS = ("auto", "llamacpp", "hf")
DEFAULT_CONTEXT = 4096          # llama.cpp cache cells (prompt + new tokens + one tree)


@dataclass
class LoadedModels:
    target: object              # a transformers model or a Backend
    draft: object
    tokenizer: object
    backend: str                # "hf" or "llamacpp"


def llamacpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def choose_backend(backend: str | None, target=None, draft=None, device: str = "cpu") -> str:
    """'hf' or 'llamacpp' for a --backend value and the models asked for."""
    backend = backend or "auto"
    if backend not in BACKENDS:
        raise RedwoodError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "llamacpp":
        if str(device).startswith("cuda"):
            raise RedwoodError("the llama.cpp backend runs on the CPU here; use --backend hf "
                               "for --device cuda")
        if not llamacpp_available():
            raise RedwoodError("llama-cpp-python is not installed; run `make llamacpp` (builds "
                               "llama-cpp-python==0.3.36 from source) or use --backend hf")
        for path in (target, draft):
            if path is not None and not _is_gguf(path):
                raise RedwoodError(f"{path} is not a .gguf file; the llama.cpp backend loads "
                                   "GGUF files (use --backend hf for Hugging Face directories)")
        return "llamacpp"
    if backend == "hf":
        return "hf"
    if str(device).startswith("cuda") or not llamacpp_available():
        return "hf"
    if target is None:                       # the shipped pair: GGUF files underneath
        return "llamacpp"
    return "llamacpp" if _is_gguf(target) and _is_gguf(draft) else "hf"


def load_models(model=None, target=None, draft=None, backend: str | None = "auto",
                dtype=None, device: str = "cpu", fast_linear: bool = False,
                draft_quantize: str | None = None, progress: bool = True,
                n_ctx: int = DEFAULT_CONTEXT) -> LoadedModels:
    """Load a pair (the shipped pair `model`, or explicit `target` + `draft` paths) on the
    backend `choose_backend` picks."""
    if (target is None) != (draft is None):
        raise RedwoodError("give both --target and --draft, or neither (to use --model)")
    kind = choose_backend(backend, target, draft, device)
    if kind == "hf":
        from redwood.models.pair import load_pair

        t, d, tokenizer = load_pair(model, target=target, draft=draft, dtype=dtype, device=device,
                                    fast_linear=fast_linear, draft_quantize=draft_quantize,
                                    progress=progress)
        return LoadedModels(t, d, tokenizer, "hf")
    if draft_quantize or fast_linear or (dtype not in (None, "float32")):
        raise RedwoodError("--draft-quantize, --fast-linear and --dtype apply to the transformers "
                           "backend; the llama.cpp backend runs the GGUF files as they are "
                           "(use --backend hf for them)")
    return _load_llamacpp(model, target, draft, progress, n_ctx)


def _load_llamacpp(model, target, draft, progress, n_ctx) -> LoadedModels:
    from redwood.backends.llamacpp import LlamaCppBackend
    from redwood.models.hf_loading import load_tokenizer

    if target is None:
        from redwood.models.shipped import DEFAULT_PAIR, shipped_gguf_pair, shipped_tokenizer_dir

        name = model or DEFAULT_PAIR
        target, draft = shipped_gguf_pair(name, progress=progress)
        tokenizer_source = shipped_tokenizer_dir(name, progress=progress)
    else:
        tokenizer_source = target
    target_backend = LlamaCppBackend(target, n_ctx=n_ctx)
    draft_backend = LlamaCppBackend(draft, n_ctx=n_ctx)
    if target_backend.vocab_size != draft_backend.vocab_size:
        raise RedwoodError(f"vocabularies differ: target {target} has {target_backend.vocab_size} "
                           f"tokens, draft {draft} has {draft_backend.vocab_size}; pick a draft "
                           "that shares the target's tokenizer")
    return LoadedModels(target_backend, draft_backend, load_tokenizer(tokenizer_source), "llamacpp")


def _is_gguf(path) -> bool:
    path = Path(os.fspath(path)).expanduser()
    return path.is_file() and path.suffix.lower() == ".gguf"
