"""What the benchmark's writers share (a leaf: it imports nothing from redwood.bench): the
method labels, the machine label, durations in words and atomic file writes."""
from __future__ import annotations

import os
from pathlib import Path

METHOD_LABELS = {"autoregressive": "autoregressive (redwood)", "hf_generate": "HF generate",
                 "hf_assisted_default": "HF assisted (default)",
                 "hf_assisted_constant": "HF assisted (constant k)", "chain": "chain",
                 "specinfer": "specinfer", "sequoia": "sequoia",
                 "llamacpp_plain": "plain llama.cpp (Llama.generate)",
                 "sequoia_fixed": "sequoia (fixed tree, untuned)",
                 "llamacpp_prompt_lookup": "llama.cpp prompt lookup",
                 "llamacpp_prompt_lookup_best": "llama.cpp prompt lookup (best k)",
                 "sequoia_governed": "sequoia (re-planned, governed)",
                 "ngram": "n-gram (governed)", "hybrid": "hybrid n-gram + model (governed)",
                 "sequoia_grown": "sequoia (grown per step, governed)"}


def cpu_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def machine_name() -> str:
    """A short label for this machine: cpu-<N>core or cuda-<gpu name>."""
    import torch

    if torch.cuda.is_available():
        return "cuda-" + "".join(c if c.isalnum() else "-" for c in
                                 torch.cuda.get_device_name(0).lower()).strip("-")
    return f"cpu-{cpu_cores()}core"


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def atomic_write(path: Path, text: str) -> None:
    """Write text (ending in a newline) to path via a temporary file, so readers never see
    half a file."""
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text if text.endswith("\n") else text + "\n")
    os.replace(temp, path)
