"""Optional CPU speed-ups for nn.Linear layers: the oneDNN path for small row counts, and
dynamic int8 quantisation (for drafts).

Why: on this project's 2-core CPU, stock MKL sgemm (what F.linear calls for float32) has a
hole for 4..15 input rows on the large MLP matrices, so a target forward over a tree of
n = 4..15 nodes costs more than over 16 (Qwen2.5-Coder-1.5B, 256-token cache, 2 threads,
min ms: n=8 699, n=12 1133, n=15 1307 vs n=16 714). oneDNN's inner product
(`torch.ops.mkldnn._linear_pointwise`) has no such hole (n=8 587, n=12 677, n=15 646,
n=16 692) and is a few % faster up to 64 rows, but slower for 2-3 rows (n=2: 291 -> 423).
So we route 4..64 rows through oneDNN and keep F.linear elsewhere (benchmarks/fast_linear.py).
Both compute the same product; results differ only by float32 rounding (different summation
order): max |logit diff| <= 8e-5 on the target, same argmax.

Nothing here changes the model's weights or their memory: the oneDNN call reads the same
float32 weight tensor (pre-packing it would need a second copy of the weights).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from redwood.errors import RedwoodError

DEFAULT_ROWS = (4, 64)     # inclusive range of input rows sent to oneDNN (measured, see module doc)


def fast_linear_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x[..., in] @ weight[out, in].T + bias through oneDNN's inner product."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _onednn_forward(layer: nn.Linear, low: int, high: int):
    """A forward for `layer`: x[..., in] -> [..., out] through oneDNN for low..high rows.
    (Weights are looked up per call, so later .to() / load_state_dict stay in effect.)"""

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if low <= rows <= high and x.dtype == torch.float32 and not torch.is_grad_enabled():
            return onednn_linear(x, layer.weight, layer.bias)
        return F.linear(x, layer.weight, layer.bias)

    return forward


def enable_fast_linear(model: nn.Module, rows: tuple[int, int] = DEFAULT_ROWS) -> int:
    """Route float32 CPU nn.Linear layers through oneDNN for `rows` (inclusive) input rows.
    Returns the number of layers changed. Undo with disable_fast_linear(model)."""
    if not fast_linear_available():
        raise RedwoodError("fast linear needs a torch build with oneDNN (mkldnn); "
                           "run without --fast-linear")
    low, high = rows
    changed = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.device.type == "cpu" \
                and module.weight.dtype == torch.float32:
            module.forward = _onednn_forward(module, low, high)   # instance attr shadows the method
            changed += 1
    return changed


def disable_fast_linear(model: nn.Module) -> int:
    """Restore nn.Linear.forward on every layer enable_fast_linear changed."""
    restored = 0
    for module in model.modules():
        if type(module) is nn.Linear and "forward" in module.__dict__:
            del module.forward
            restored += 1
    return restored


def quantize_int8(model: nn.Module) -> nn.Module:
    """Dynamic int8 quantisation of every nn.Linear (weights int8, activations quantised per
    call), in place. CPU only. Speculative decoding stays exact with any draft; a quantised
    draft only changes how often its guesses are accepted."""
    if next(model.parameters()).device.type != "cpu":
        raise RedwoodError("int8 quantisation runs on CPU only; use --device cpu or drop --quantize")
    import warnings

    from torch.ao.quantization import quantize_dynamic

    model.float()     # the dynamic quantiser expects float32 weights
    with warnings.catch_warnings():   # torch.ao.quantization is deprecated (torchao) but works
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)


def apply_speedups(model: nn.Module, fast_linear: bool = False, quantize: str | None = None) -> nn.Module:
    """The load_model flags: quantize ("int8") first, then fast_linear on what stays float."""
    if quantize not in (None, "int8"):
        raise RedwoodError(f"unknown quantisation {quantize!r}; the only choice is int8")
    if quantize == "int8":
        quantize_int8(model)
    if fast_linear:
        enable_fast_linear(model)
    return model
