"""load_pair: a target + draft model and the target's tokenizer, from two local paths or a
shipped pair (built into the cache on first use)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from redwood.errors import RedwoodError
from redwood.models.hf_loading import check_same_vocab, load_model, load_tokenizer
from redwood.models.shipped import DEFAULT_PAIR, shipped_pair_dirs

__all__ = ["load_pair"]


def _config_vocab_size(path) -> int | None:
    """config.json's vocab_size of an HF directory (None for GGUF or unreadable configs)."""
    try:
        return int(json.loads((Path(path).expanduser() / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _precheck_vocab(target, draft) -> None:
    sizes = _config_vocab_size(target), _config_vocab_size(draft)
    if None not in sizes and sizes[0] != sizes[1]:
        raise RedwoodError(f"vocabularies differ: target {target} has {sizes[0]} tokens, draft "
                           f"{draft} has {sizes[1]}; pick a draft that shares the target's tokenizer")


def load_pair(name: str | None = DEFAULT_PAIR, target: str | os.PathLike | None = None,
              draft: str | os.PathLike | None = None, dtype: str | torch.dtype | None = None,
              device: str | torch.device = "cpu", fast_linear: bool = False,
              draft_quantize: str | None = None, progress: bool = True):
    """(target_model, draft_model, tokenizer): explicit `target` + `draft` paths, or the shipped
    pair `name` (built into the cache on first use). The tokenizer is the target's."""
    if (target is None) != (draft is None):
        raise RedwoodError("give both --target and --draft, or neither (to use --model)")
    if target is None:
        target, draft = shipped_pair_dirs(progress=progress, name=name or DEFAULT_PAIR)
    _precheck_vocab(target, draft)             # before spending seconds and GBs on weights
    target_model = load_model(target, dtype=dtype, device=device, fast_linear=fast_linear)
    draft_model = load_model(draft, dtype=dtype, device=device, fast_linear=fast_linear,
                             quantize=draft_quantize)
    check_same_vocab(target_model, draft_model)
    return target_model, draft_model, load_tokenizer(target)
