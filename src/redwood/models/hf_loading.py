"""Loading causal LMs and tokenizers with transformers: local Hugging Face directories and GGUF files.

Nothing here ever contacts a model hub: every transformers call passes local_files_only=True
and HF_HUB_OFFLINE=1 is set in-process before transformers is imported.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from redwood.errors import RedwoodError  # noqa: E402
from redwood.models.manifest import MANIFEST, check_manifest  # noqa: E402
from redwood.models.resident_memory import own_memory  # noqa: E402
from redwood.models.threads import configure_threads  # noqa: E402


def _load_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "these files do not load" (reported as RedwoodError)."""
    from safetensors import SafetensorError

    return (OSError, ValueError, RuntimeError, KeyError, EOFError, SafetensorError)


_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}

__all__ = ["load_model", "load_tokenizer", "check_same_vocab", "resolve_dtype", "resolve_device",
           "hub_offline", "model_name", "forget_gguf_quantizer"]


def hub_offline() -> None:
    """Force offline mode, also when huggingface_hub was imported before us."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import huggingface_hub.constants as hub_constants
        hub_constants.HF_HUB_OFFLINE = True
    except (ImportError, AttributeError):
        pass


def resolve_device(device: str | torch.device | None) -> torch.device:
    """"cpu", "cuda", "cuda:1", or "auto" (CUDA when present, else CPU)."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise RedwoodError(f"unknown device {device!r}; use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RedwoodError(f"device {device} requested but CUDA is not available; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise RedwoodError(f"device {device} is not supported; use cpu, cuda, cuda:N or auto")
    return device


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """None -> float32 on CPU, bfloat16 on CUDA (float16 where bf16 is unsupported)."""
    if dtype is None:
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise RedwoodError(f"unknown dtype {dtype!r}; use float32, bfloat16, float16 or float64")
    return _DTYPES[key]


def _resolve_source(path: str | os.PathLike, tokenizer: bool = False) -> tuple[Path, str | None]:
    """(directory, gguf file name or None) for a model path; RedwoodError saying what to do.
    With tokenizer=True a directory with only tokenizer files is accepted too."""
    path = Path(path).expanduser()
    if not path.exists():
        raise RedwoodError(f"model path {path} does not exist; give a local Hugging Face model "
                           "directory (config.json + *.safetensors) or a .gguf file, or use the "
                           "shipped pair (--model, installed by `make models`)")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise RedwoodError(f"{path} is a file but not a .gguf; give a .gguf file or a "
                               "Hugging Face model directory")
        return path.parent, path.name
    if tokenizer and any((path / name).is_file() for name in _TOKENIZER_FILES):
        return path, None
    if (path / "config.json").is_file():
        if not tokenizer and not any(next(path.glob(pattern), None) for pattern in _WEIGHT_PATTERNS):
            raise RedwoodError(f"{path} has a config.json but no weights (*.safetensors or *.bin); "
                               "copy the model's weight files there")
        return path, None
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return path, ggufs[0].name
    raise RedwoodError(f"{path} is not a model directory (no config.json"
                       f"{'' if not ggufs else ' and several .gguf files: name one'}); "
                       "give a Hugging Face model directory or a .gguf file")


def _load_failed(path: Path, err: Exception) -> RedwoodError:
    """A one-line RedwoodError for files that exist but do not load."""
    reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    hint = "the files may be corrupt or incomplete: fetch them again"
    if (path / MANIFEST).is_file():
        problem = check_manifest(path)
        hint = (f"the redwood cache is damaged ({problem}): delete {path} and run again"
                if problem else f"delete {path} and run again to rebuild it")
    return RedwoodError(f"could not load the model in {path} ({reason}); {hint}")


def load_model(path: str | os.PathLike, dtype: str | torch.dtype | None = None,
               device: str | torch.device = "cpu", fast_linear: bool = False,
               quantize: str | None = None):
    """Load a local causal LM (HF directory or .gguf file) in eval mode with gradients off.

    dtype: None = float32 on CPU (bfloat16 on CUDA); device: cpu, cuda[:N] or auto.
    fast_linear: route CPU float32 nn.Linear layers through oneDNN (see cpu_kernels.py).
    quantize: "int8" = dynamic int8 quantisation of the Linear layers (CPU only; for drafts).
    """
    from transformers import AutoModelForCausalLM

    hub_offline()
    directory, gguf_file = _resolve_source(path)
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    if device.type == "cpu":
        configure_threads()
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(directory), dtype=dtype, local_files_only=True, **extra)
    except _load_errors() as err:
        raise _load_failed(directory, err) from err
    forget_gguf_quantizer(model)
    model.to(device).eval().requires_grad_(False)
    if device.type == "cpu":
        own_memory(model)
    if fast_linear or quantize:
        from redwood.models.cpu_kernels import apply_speedups
        apply_speedups(model, fast_linear=fast_linear, quantize=quantize)
    return model


def forget_gguf_quantizer(model) -> None:
    """A GGUF-loaded model holds plain dequantised float tensors but still carries the GGUF
    quantizer and config.quantization_config, which block save_pretrained and would make a
    later from_pretrained look for a GGUF file; drop both."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer of a local HF directory or .gguf file."""
    from transformers import AutoTokenizer

    hub_offline()
    directory, gguf_file = _resolve_source(path, tokenizer=True)
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, **extra)
    except _load_errors() as err:
        raise _load_failed(directory, err) from err


def model_name(model) -> str:
    """A human name for messages: the path it was loaded from, else its class."""
    return getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", "") \
        or type(model).__name__


def _vocab_sizes(model) -> tuple[int, int]:
    """(config.vocab_size, rows of the output layer = width of the logits)."""
    output = model.get_output_embeddings()
    weight = getattr(output, "weight", None) if output is not None else None
    if callable(weight):              # a dynamically quantised Linear exposes weight()
        weight = weight()
    if weight is None:
        weight = model.get_input_embeddings().weight
    return int(model.config.vocab_size), int(weight.shape[0])


def check_same_vocab(target, draft) -> int:
    """Return the shared vocabulary size; RedwoodError naming both models if they differ.
    Speculative decoding compares the two models' distributions token by token, so both
    config.vocab_size and the number of logits must agree."""
    target_sizes, draft_sizes = _vocab_sizes(target), _vocab_sizes(draft)
    if target_sizes != draft_sizes:
        def describe(sizes):
            return str(sizes[0]) if sizes[0] == sizes[1] else f"{sizes[0]} ({sizes[1]} logits)"
        raise RedwoodError(
            f"vocabularies differ: target {model_name(target)} has {describe(target_sizes)} tokens, "
            f"draft {model_name(draft)} has {describe(draft_sizes)}; pick a draft that shares the "
            "target's tokenizer")
    return target_sizes[0]
