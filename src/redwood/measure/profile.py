"""`redwood profile`: how long one forward takes on this machine, for every size the planner
may choose.

target_ms[n]: one target forward over n tree tokens (the root and n - 1 drafted nodes, with
    logits for every row, as verification needs) on top of a cache of `context` tokens.
draft_ms[w]: one draft forward over a level of w tokens (logits for every row) on top of
    the same cache.
The planner never interpolates between sizes and never assumes t(n) is monotonic (docs/design.md
§3: on CPUs small row counts can be slower than larger ones), so every size it may pick is
measured. Forwards use the engine's own Backend calls (run_tree over a tree of the planner's
shape, then keep_path([]) to drop it), so they take the same code path as decoding.

Sizes are timed in interleaved rounds (every size once per round), so slow drift of the
machine (thermal, other processes) spreads over all sizes instead of bending the curve.

`profile_target_by_context` times the target's sizes again on top of longer caches (1,024 and
2,048 tokens in the first-use profile): attention reads every cached cell, so on a CPU t(n)
at a request's context can be well above the 128-token figure (Profile.target_ms_at).
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from redwood.decode.request import as_backend
from redwood.errors import RedwoodError
from redwood.plan.formats import Profile
from redwood.plan.tree import Tree, star

DEFAULT_MAX_BUDGET = 128
# Illustrative acceptance shape used only to give the timed trees a realistic form.
_SHAPE_P = (0.8, 0.1, 0.04, 0.02, 0.01)


def default_sizes(max_budget: int = DEFAULT_MAX_BUDGET) -> list[int]:
    """Every n from 1 to 32, then 48, 64, 96, 128, ... (x1.5 / x2 steps), up to max_budget."""
    if isinstance(max_budget, bool) or not isinstance(max_budget, int) or max_budget < 1:
        raise RedwoodError(f"max budget must be an integer >= 1, got {max_budget!r}")
    sizes = list(range(1, min(32, max_budget) + 1))
    step = 32
    while True:
        for n in (step + step // 2, 2 * step):
            if n <= max_budget:
                sizes.append(n)
        step *= 2
        if step >= max_budget:
            return sizes


def timing_tree(n: int) -> Tree:
    """A tree of n nodes shaped like the planner's output (the DP tree for an illustrative
    vector, at most 8 levels); only its mask pattern and depths are used for timing."""
    from redwood.plan.planner import optimal_tree

    return optimal_tree(list(_SHAPE_P), n, max(1, min(8, n)))


class _Timer:
    """Wall-clock seconds of a callable (synchronising CUDA so the GPU work is counted)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start


class _Bench:
    """One backend with `context` committed tokens, and a prepared tree per size."""

    def __init__(self, backend, context_ids: torch.Tensor, shape: str):
        self.backend = backend
        self.context = len(context_ids)
        backend.reset()
        with torch.inference_mode():
            backend.append(context_ids, rows=0)
        self.shape = shape              # "tree": target's tree over n; "level": draft's level of w
        self.inputs: dict[int, tuple] = {}

    def extend(self, ids: torch.Tensor) -> None:
        """Commit more context tokens (prepare the sizes again: the root position moved)."""
        with torch.inference_mode():
            self.backend.append(ids, rows=0)
        self.context += len(ids)
        self.inputs.clear()

    def prepare(self, n: int, vocab: int, generator: torch.Generator) -> None:
        """The tree, nodes, token ids and root position timed for size n. The target runs a
        whole tree (root included) after the context; the draft runs one level of n
        siblings below a committed root (the context's last token)."""
        if self.shape == "tree":
            tree, nodes, root_position = timing_tree(n), list(range(n)), self.context
        else:
            tree, nodes, root_position = star(n), list(range(1, n + 1)), self.context - 1
        self.backend.check_tree(tree)
        ids = torch.randint(2, vocab, (len(nodes),), generator=generator)
        self.inputs[n] = (tree, nodes, ids, root_position)

    def run(self, n: int) -> None:
        tree, nodes, ids, root_position = self.inputs[n]
        with torch.inference_mode():
            self.backend.run_tree(tree, nodes, ids, root_position)
        self.backend.keep_path([])


def profile_latency(target, draft, context: int = 256, budgets=None, widths=None,
                    repeats: int = 5, warmup: int = 2, progress: bool = True,
                    seed: int = 0, statistic: str = "median") -> Profile:
    """Median forward times (ms) of the target by tree size and the draft by level width.

    context: cached tokens under each forward (random ids; attention cost depends on the
    length, not the content). budgets: target sizes n (default `default_sizes()`); widths:
    draft level widths (default: the budgets). repeats: timed rounds; warmup: untimed
    rounds first. Returns a formats.Profile with the raw times under "samples_ms".
    """
    budgets = _check_sizes(budgets if budgets is not None else default_sizes(), "budgets")
    widths = _check_sizes(widths if widths is not None else budgets, "widths")
    _check_count(repeats, "repeats", 1)
    _check_count(warmup, "warmup", 0)
    _check_count(context, "context", 1)
    target_model, draft_model = target, draft
    target, draft = as_backend(target), as_backend(draft)
    _check_positions(target, draft, context, max(max(budgets), max(widths)))
    vocab = target.vocab_size
    generator = torch.Generator().manual_seed(seed)
    context_ids = torch.randint(2, vocab, (context,), generator=generator)
    benches = {"target": _Bench(target, context_ids, "tree"),
               "draft": _Bench(draft, context_ids, "level")}
    jobs = [("target", n) for n in budgets] + [("draft", w) for w in widths]
    for name, size in jobs:
        benches[name].prepare(size, vocab, generator)
    load_before = _load_average()
    samples = _timed_rounds(jobs, lambda job: benches[job[0]].run(job[1]),
                            _Timer(target.device), warmup, repeats, progress)
    # median: the typical cost on a quiet machine; min: robust when a short run may overlap
    # other work (delays only ever add time), as the first-use profile does.
    reduce = _REDUCE[statistic]
    medians = {job: reduce(times) for job, times in samples.items()}
    return Profile(
        target_ms={n: medians[("target", n)] for n in budgets},
        draft_ms={w: medians[("draft", w)] for w in widths},
        device=device_description(target.device), dtype=model_dtype(target_model), context=context,
        extra={"draft_dtype": model_dtype(draft_model),
               "backend": backend_kind(target),
               "fast_linear": {"target": fast_linear_enabled(target_model),
                               "draft": fast_linear_enabled(draft_model)},
               "source": {"tool": "redwood profile", "repeats": repeats, "warmup": warmup,
                          "statistic": statistic, "target": target.name,
                          "draft": draft.name, "torch": torch.__version__,
                          "threads": torch.get_num_threads(),
                          "load_average_1min": {"before": load_before, "after": _load_average()},
                          "target_shape": "DP tree (<= 8 levels), all rows' logits",
                          "draft_shape": "one level of w siblings, all rows' logits"},
               "samples_ms": {"target": {str(n): samples[("target", n)] for n in budgets},
                              "draft": {str(w): samples[("draft", w)] for w in widths}}})


def profile_target_by_context(target, contexts, budgets, repeats: int = 3, warmup: int = 1,
                              progress: bool = True, seed: int = 0, statistic: str = "min",
                              timer=None) -> dict[int, dict[int, float]]:
    """The target's forward times (ms) by tree size n at each context length:
    {context: {n: ms}}, the same tree shapes and statistic as profile_latency.

    The cache is filled once, in ascending order of context, with a fixed pseudo-random token
    sequence (`seed`; attention cost depends on the length, not the content): each context
    appends only the tokens beyond the previous one, so the tables up to 2,048 cost one
    2,048-token prefill (untimed). At each context the sizes are timed in interleaved rounds,
    each tree dropped again (keep_path([])), so the cache stays at that context.
    timer(fn) -> seconds replaces the clock (tests)."""
    import sys

    budgets = _check_sizes(budgets, "budgets")
    contexts = sorted({int(c) for c in contexts})
    _check_count(repeats, "repeats", 1)
    _check_count(warmup, "warmup", 0)
    if not contexts:
        return {}
    _check_count(contexts[0], "context", 1)
    target = as_backend(target)
    _check_positions(target, target, contexts[-1], max(budgets))
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, target.vocab_size, (contexts[-1],), generator=generator)
    bench, timer, out = None, timer or _Timer(target.device), {}
    for context in contexts:
        filled = 0 if bench is None else bench.context
        if progress:
            print(f"redwood: timing the target at a {context}-token context ({len(budgets)} "
                  f"sizes, after filling {context - filled} more cache tokens: tens of "
                  "seconds on a 2-core CPU)", file=sys.stderr, flush=True)
        if bench is None:
            bench = _Bench(target, ids[:context], "tree")
        else:
            bench.extend(ids[filled:context])
        for n in budgets:
            bench.prepare(n, target.vocab_size, generator)
        samples = _timed_rounds(budgets, bench.run, timer, warmup, repeats, progress)
        out[context] = {n: _REDUCE[statistic](times) for n, times in samples.items()}
    target.reset()
    return out


def _timed_rounds(jobs, run, timer, warmup: int, repeats: int, progress: bool) -> dict:
    """{job: [ms, ...]}: every job once per round (warm-up rounds untimed)."""
    samples = {job: [] for job in jobs}
    bar = _progress_bar(len(jobs) * (warmup + repeats), progress)
    for round_index in range(warmup + repeats):
        for job in jobs:
            seconds = timer(lambda: run(job))
            if round_index >= warmup:
                samples[job].append(1000.0 * seconds)
            bar.update(1)
    bar.close()
    return samples


_REDUCE = {"median": statistics.median, "min": min}


def device_description(device: torch.device) -> str:
    """E.g. 'cpu: Intel(R) Xeon(R) ... (2 threads)' or 'cuda: NVIDIA H200'."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {name} ({torch.get_num_threads()} threads)"


def backend_kind(backend) -> str:
    """'hf' or 'llamacpp': which runtime a profile was measured on."""
    return getattr(backend, "kind", "hf")


def model_dtype(model) -> str:
    """'float32', 'bfloat16', ...; 'int8-dynamic+float32' for a dynamically quantised model;
    a Backend's own dtype name for other runtimes."""
    if hasattr(model, "dtype_name"):
        return model.dtype_name
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    quantized = any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules())
    return f"int8-dynamic+{dtype}" if quantized else dtype


def fast_linear_enabled(model) -> bool:
    """Whether fastlinear.enable_fast_linear routed this model's Linear layers through oneDNN
    (it sets an instance `forward` on them); timings differ a lot for 4..64 rows."""
    from torch import nn

    if not isinstance(model, nn.Module):
        return False
    return any(type(m) is nn.Linear and "forward" in m.__dict__ for m in model.modules())


def _load_average() -> float | None:
    """The machine's 1-minute load average: timings taken while other work runs are slower."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _progress_bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="profile", unit="fwd", disable=not enabled, leave=False)


def _check_sizes(sizes, what: str) -> list[int]:
    try:
        values = sorted({int(s) for s in sizes})
    except (TypeError, ValueError):
        raise RedwoodError(f"{what} must be a list of positive integers") from None
    if not values or values[0] < 1:
        raise RedwoodError(f"{what} must be a non-empty list of positive integers")
    if values[0] != 1:
        raise RedwoodError(f"{what} must include 1 (plain decoding is the baseline)")
    return values


def _check_count(value, what: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise RedwoodError(f"{what} must be an integer >= {minimum}, got {value!r}")


def _check_positions(target, draft, context: int, largest: int) -> None:
    for backend in (target, draft):
        limit = backend.max_positions
        if limit and context + largest + 8 > limit:
            raise RedwoodError(f"context {context} + size {largest} exceeds the model's "
                               f"{limit} positions; lower --context or --max-budget")
