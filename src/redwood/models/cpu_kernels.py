"""Optional CPU speed-ups for nn.Linear layers: the oneDNN path for small row counts, and
dynamic int8 quantisation (for drafts).

Why: on this project's 2-core CPU, stock MKL sgemm (what F.linear calls for float32) has a
hole for 4..15 input rows on the large MLP matrices, so a target forward over a tree of
n = 4..15 nodes costs more than over 16 (Qwen2.5-Coder-1.5B, 256-token cache, 2 threads,
min ms: n=8 699, n=12 1133, n=15 1307 vs n=16 714). oneDNN's inner product
(`torch.ops.mkldnn._linear_pointwise`) has no such hole (n=8 587, n=12 677, n=15 646,
n=16 692) and is a few % faster up to 64 rows, but slower for 2-3 rows (n=2: 291 -> 423).
So `--fast-linear` routes 4..64 rows through oneDNN and keeps F.linear elsewhere
(benchmarks/fast_linear.py). Other CPUs differ (on a 2-core AMD EPYC oneDNN wins at every row
count, one included: docs/design.md §6), so `time_linear_kernels` times both kernels on a
model's own Linear shapes per row count, and measure/machine_profile.choose_linear_rows routes
each row count to the faster one (`enable_fast_linear(model, rows=<set>)`).
Both compute the same product; results differ only by float32 rounding (different summation
order): max |logit diff| <= 8e-5 on the target, same argmax.

Nothing here changes the model's weights or their memory: the oneDNN call reads the same
float32 weight tensor (pre-packing it would need a second copy of the weights).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

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


def row_predicate(rows) -> Callable[[int], bool]:
    """Which row counts go to oneDNN, as a predicate. rows: a 2-tuple (low, high), an inclusive
    range (the original API); any other collection of ints (set, frozenset, list), exactly
    those counts; or a callable rows -> bool, used as is."""
    if callable(rows):
        return rows
    if isinstance(rows, tuple) and len(rows) == 2:
        low, high = int(rows[0]), int(rows[1])
        return lambda n: low <= n <= high
    chosen = frozenset(int(n) for n in rows)
    return chosen.__contains__


def _onednn_forward(layer: nn.Linear, use_onednn: Callable[[int], bool]):
    """A forward for `layer`: x[..., in] -> [..., out] through oneDNN for the row counts
    `use_onednn` accepts. (Weights are looked up per call, so later .to() / load_state_dict
    stay in effect.)"""

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if x.dtype == torch.float32 and not torch.is_grad_enabled() and use_onednn(rows):
            return onednn_linear(x, layer.weight, layer.bias)
        return F.linear(x, layer.weight, layer.bias)

    forward.use_onednn = use_onednn          # read back by onednn_rows (profile keys)
    return forward


def float_linears(model: nn.Module) -> list[nn.Linear]:
    """The float32 CPU nn.Linear layers: what the oneDNN path can take."""
    return [m for m in model.modules() if type(m) is nn.Linear
            and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32]


def enable_fast_linear(model: nn.Module, rows=DEFAULT_ROWS) -> int:
    """Route float32 CPU nn.Linear layers through oneDNN for the row counts `rows` selects
    (see row_predicate: (low, high) inclusive, a set of counts, or a predicate). Returns the
    number of layers changed. Undo with disable_fast_linear(model)."""
    if not fast_linear_available():
        raise RedwoodError("fast linear needs a torch build with oneDNN (mkldnn); "
                           "run without --fast-linear")
    use_onednn = row_predicate(rows)
    layers = float_linears(model)
    for module in layers:
        module.forward = _onednn_forward(module, use_onednn)   # instance attr shadows the method
    return len(layers)


def apply_kernel_choice(model: nn.Module, rows, timed=None) -> int:
    """Route the row counts in `rows` (a set, e.g. from choose_linear_rows) through oneDNN,
    every other count through F.linear. With `timed` (the counts that were timed), a count
    that was not timed goes the way of the nearest timed one (nearest_timed_rows). An empty set
    restores the stock layers, so a model that gains nothing keeps the exact stock forward.
    Returns the layers routed."""
    rows = frozenset(int(n) for n in rows)
    disable_fast_linear(model)
    if not rows:
        return 0
    return enable_fast_linear(model, rows if timed is None else nearest_timed_rows(rows, timed))


def nearest_timed_rows(chosen, timed) -> Callable[[int], bool]:
    """Predicate: does an n-row input go to oneDNN? Yes when the timed count nearest to n (on a
    log scale; n itself when timed) is in `chosen`. Prompts come in every length, so prefill
    is timed at a few lengths (48 .. 512 rows) and each prompt takes the kernel that won at the
    length nearest its own; beyond the longest timed count, the longest's choice."""
    chosen = frozenset(int(n) for n in chosen)
    timed = sorted({int(n) for n in timed})
    decided: dict[int, bool] = {}

    def use_onednn(n: int) -> bool:
        if n not in decided:
            nearest = min(timed, key=lambda t: (abs(math.log(max(n, 1) / t)), t))
            decided[n] = nearest in chosen
        return decided[n]

    return use_onednn


def onednn_rows(model: nn.Module, upto: int = 64) -> tuple[int, ...] | None:
    """The row counts 1..upto that the model's patched Linear layers send to oneDNN (as
    enable_fast_linear set them: all layers alike); None when no layer is patched."""
    for module in model.modules():
        use_onednn = getattr(module.__dict__.get("forward"), "use_onednn", None)
        if type(module) is nn.Linear and use_onednn is not None:
            return tuple(n for n in range(1, upto + 1) if use_onednn(n))
    return None


def disable_fast_linear(model: nn.Module) -> int:
    """Restore nn.Linear.forward on every layer enable_fast_linear changed."""
    restored = 0
    for module in model.modules():
        if type(module) is nn.Linear and "forward" in module.__dict__:
            del module.forward
            restored += 1
    return restored


# Layers wider than this (the vocabulary head: 150k outputs) are timed on their first
# SLICE_OUT output rows and the time scaled up: a GEMM's cost grows linearly with its output
# features, and timing the whole head at every row count would dominate the measurement.
SLICE_OUT = 8192


def linear_shapes(model: nn.Module) -> list[list[int]]:
    """[[out, in, has bias, count], ...] of the float32 Linear layers, sorted: what the kernel
    timings depend on (a cache key)."""
    counts: dict[tuple[int, int, int], int] = {}
    for m in float_linears(model):
        key = (m.out_features, m.in_features, int(m.bias is not None))
        counts[key] = counts.get(key, 0) + 1
    return [[*key, count] for key, count in sorted(counts.items())]


def _shape_samples(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor | None, float]]:
    """One (weight, bias, weight in the total) per distinct Linear shape: the first layer of
    that shape, cut to SLICE_OUT outputs, weighted by (layers of that shape) x (cut factor)."""
    first: dict[tuple[int, int, bool], nn.Linear] = {}
    count: dict[tuple[int, int, bool], int] = {}
    for m in float_linears(model):
        key = (m.out_features, m.in_features, m.bias is not None)
        first.setdefault(key, m)
        count[key] = count.get(key, 0) + 1
    samples = []
    for key, m in first.items():
        keep = min(m.out_features, SLICE_OUT)
        bias = None if m.bias is None else m.bias[:keep]
        samples.append((m.weight[:keep], bias, count[key] * m.out_features / keep))
    return samples


def _pass_ms(kernel, samples, inputs) -> float:
    """Estimated ms of one forward's Linear work: each distinct shape run once, weighted.
    Running the shapes back to back (a 1.5B layer's are ~190 MB) keeps the weights coming
    from memory, as in a real forward, rather than from a warm cache."""
    total = 0.0
    for (weight, bias, scale), x in zip(samples, inputs):
        start = time.perf_counter()
        kernel(x, weight, bias)
        total += (time.perf_counter() - start) * scale
    return total * 1e3


def time_linear_kernels(model: nn.Module, rows, repeats: int = 3,
                        progress: Callable[[int, int], None] | None = None) -> dict[int, dict]:
    """{n: {"f_linear": ms, "onednn": ms}}: the model's Linear work for an n-row input through
    each kernel, the minimum over `repeats` rounds after a warm-up round. Each round sweeps
    every row count, the kernels alternating which runs first: a burst of other work (on a
    shared 2-core machine it can add 100+ ms) then spoils one round of a few counts, not
    every repeat of one. progress(round, rounds) after each round. Empty if no float32 Linear."""
    samples = _shape_samples(model)
    if not samples:
        return {}
    kernels = {"f_linear": F.linear, "onednn": lambda x, w, b: onednn_linear(x, w, b)}
    generator = torch.Generator().manual_seed(0)
    rows = [int(n) for n in rows]
    inputs = {n: [torch.randn(1, n, w.shape[1], generator=generator) for w, _, _ in samples]
              for n in rows}
    best = {n: dict.fromkeys(kernels, float("inf")) for n in rows}
    with torch.inference_mode():
        for rnd in range(repeats + 1):                   # round 0 warms both kernels up
            for n in rows:
                names = list(kernels) if (rnd + n) % 2 else list(kernels)[::-1]
                for name in names:
                    ms = _pass_ms(kernels[name], samples, inputs[n])
                    if rnd:
                        best[n][name] = min(best[n][name], ms)
            if progress is not None:
                progress(rnd, repeats)
    return {n: {k: round(v, 4) for k, v in t.items()} for n, t in best.items()}


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
