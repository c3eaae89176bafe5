"""The latency profile of *this* machine, measured at first use and cached.

A shipped bundle's trees were sized for the machine it was tuned on; MKL's and llama.cpp's small-
row speeds differ between CPUs (docs/design.md §6), so a bundle's latencies are never applied
elsewhere. `machine_profile` measures t_target(n) and the draft's per-level cost in seconds (few
repeats, a short context, the sizes the planner may choose), caches it under
$REDWOOD_CACHE/profiles/, and `replan` plans the bundle's acceptance vectors against it.

The cache key is everything that changes the timings: CPU model, thread count, backend,
models (path, size, dtype), library versions and which row counts each model sends to oneDNN.
A profile is reused only when the key matches.

On llama.cpp the target is also timed at longer contexts (CONTEXTS: 128, 1,024, 2,048 cached
tokens, each cut to what n_ctx leaves beside the largest tree), stored as the profile's
target_ms_by_context: on a CPU t(n) grows with the cells attended over, and requests run at
500-4,000 tokens, not 128. The contexts are part of the key, so profiles cached before the table
existed are measured again. The transformers backend keeps its 128-token profile only
(target_ms_by_context None): its first use already times kernels and the profile, and two more
sweeps of every size plus a 2,048-token prefill in torch would add a minute or more to it on a
small CPU (on a GPU, where that backend earns its keep, the context costs little).

Before it, `choose_linear_rows` picks the matmul kernel per row count (F.linear or oneDNN,
whichever times faster on the model's Linear shapes here; cached under profiles/kernels/), since
the faster kernel differs between CPUs and the latencies depend on it (docs/design.md §3.1, §6).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from pathlib import Path

from redwood.plan.formats import Profile, check_times_by_context

QUICK_SIZES = tuple(range(1, 17)) + (20, 24, 28, 32, 40, 48)   # planners: <= 32; grown trees: <= 48
QUICK = dict(context=128, repeats=3, warmup=1)
CONTEXTS = (128, 1024, 2048)    # the target's by-context table (llama.cpp); 128 = QUICK's


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags_digest(cpuinfo: str | None = None) -> str:
    """A digest of the CPU's feature flags: machines sold under one model name ("AMD EPYC")
    differ (AVX2 only or AVX-512 visible) and so do their timings, so a profile is measured
    again when the flags change. '' where /proc/cpuinfo is not readable."""
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        return ""
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])
    return hashlib.sha256(" ".join(sorted(set(flags))).encode()).hexdigest()[:12] if flags else ""


def profile_key(target, draft) -> dict:
    """What the timings depend on. target, draft: Backends."""
    import torch

    versions = {"redwood": _version("redwood"), "torch": torch.__version__}
    if getattr(target, "kind", "hf") == "llamacpp":
        versions["llama_cpp"] = _version("llama_cpp_python")
        versions["llama_cpp_build"] = _llama_build_id()
    key = {"cpu": cpu_model(), "cpu_flags": cpu_flags_digest(), "threads": _threads(target),
           "backend": getattr(target, "kind", "hf"),
           "device": str(target.device),
           "target": _model_id(target), "draft": _model_id(draft), "versions": versions}
    routing = {role: _routed_rows(b) for role, b in (("target", target), ("draft", draft))}
    if any(rows is not None for rows in routing.values()):
        # oneDNN rows change the timings; stock models keep the key they always had
        key["linear_rows"] = routing
    return key


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def profile_dir(cache_dir=None) -> Path:
    from redwood.cache_dirs import cache_root

    return cache_root(cache_dir) / "profiles"


def cached(directory: Path, key: dict, load, make, announce: str = "", prefix: str = "",
           fresh_thread: bool = False):
    """The value cached for `key` in `directory` (a file named by the key's digest), else
    make(path), which measures and writes it; one process measures at a time (a file lock).
    load(path, key) returns None when the file is absent, damaged or made under another key.
    `announce` is printed to stderr before measuring. fresh_thread (llama.cpp measurements): make
    runs on a thread of its own, so the OpenMP team its native work starts ends with it
    (measure/fresh_thread.py: a team left on the caller's thread slowed every later decode on
    another thread by 20 %). torch-only measurements stay on the caller's thread: a process that
    loaded a torch model there already has that thread's team, and a second one would throttle
    the measurement itself."""
    from filelock import FileLock

    from redwood.measure.fresh_thread import run_on_fresh_thread

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{prefix}{key_digest(key)}.json"
    with FileLock(str(path) + ".lock"):
        value = load(path, key)
        if value is not None:
            return value
        if announce:
            print(announce, file=sys.stderr, flush=True)
        return run_on_fresh_thread(make, path) if fresh_thread else make(path)


def save_profile(profile: Profile, key: dict, path: Path) -> Profile:
    """Stamp `profile` with the key it was measured under (load_matching checks it) and save."""
    profile.extra["machine_key"] = key
    profile.save(path)
    return profile


def machine_profile(target, draft, sizes=QUICK_SIZES, cache_dir=None, progress: bool = True,
                    measure=None) -> Profile:
    """The cached profile for (this machine, these models), measuring it first if needed.
    target, draft: Backends (or transformers models). `measure(target, draft, sizes)` replaces
    the measurement (tests)."""
    from redwood.decode.request import as_backend

    target, draft = as_backend(target), as_backend(draft)
    # the sizes are part of the key: a profile without the sizes asked for (40 and 48 came
    # with grown trees of up to 48 nodes) is measured again, never silently extrapolated
    key = {**profile_key(target, draft), "sizes": sorted(int(n) for n in sizes)}
    contexts = profile_contexts(target, sizes)
    if contexts:            # llama.cpp: a profile cached without the by-context table is redone
        key["contexts"] = contexts
    directory = profile_dir(cache_dir)
    announce = (f"redwood: measuring this machine's forward times (first use on {key['cpu']}, "
                f"{key['backend']} backend; cached in {directory})") if progress else ""
    return cached(directory, key, load_matching, lambda path: save_profile(
        (measure or _measure)(target, draft, list(sizes), progress), key, path), announce,
        fresh_thread=bool(contexts))                      # contexts: a llama.cpp target


def profile_contexts(target, sizes, contexts=CONTEXTS) -> list[int]:
    """The context lengths the target is timed at: `contexts`, each cut to what the backend's
    n_ctx leaves beside the largest size (and the 8 cells of slack the profile keeps), never
    below QUICK's 128; [] on backends other than llama.cpp (their profile is the 128 table)."""
    from redwood.measure.profile import backend_kind

    if backend_kind(target) != "llamacpp":
        return []
    base = QUICK["context"]
    limit = (target.max_positions or 10**9) - max(int(n) for n in sizes) - 8
    return sorted({base} | {min(int(c), limit) for c in contexts if min(int(c), limit) > base})


def _measure(target, draft, sizes, progress) -> Profile:
    from redwood.measure.profile import profile_latency, profile_target_by_context

    contexts = profile_contexts(target, sizes)       # from the sizes asked for, as in the key
    room = min(b.max_positions or 10**9 for b in (target, draft))
    sizes = [n for n in sizes if QUICK["context"] + n + 8 <= room] or [1]
    profile = profile_latency(target, draft, context=QUICK["context"], budgets=sizes,
                              repeats=QUICK["repeats"], warmup=QUICK["warmup"],
                              progress=progress, statistic="min")
    if contexts:
        # the 128 table is the profile's own target_ms; longer contexts are timed after it
        longer = profile_target_by_context(
            target, [c for c in contexts if c != QUICK["context"]], sizes,
            repeats=QUICK["repeats"], warmup=QUICK["warmup"], progress=progress, statistic="min")
        profile.target_ms_by_context = check_times_by_context(
            {QUICK["context"]: dict(profile.target_ms), **longer})
    return profile


def load_matching(path: Path, key: dict) -> Profile | None:
    """The profile at `path` if it was measured under exactly `key` (else None: remeasure)."""
    if not path.is_file():
        return None
    try:
        profile = Profile.load(path)
    except Exception:                     # unreadable or damaged: measure again
        return None
    return profile if profile.extra.get("machine_key") == key else None


KERNEL_ROWS = tuple(range(1, 33))     # the tree sizes and draft level widths the planner may use
# Prompt lengths (prefill, and a fused prefill's prompt + tree) are timed at these counts and
# routed by the nearest (cpu_kernels.nearest_timed_rows). On a 2-core AMD EPYC oneDNN does a
# 128-row Linear pass in 1.0 s against F.linear's 2.4 s: a prompt's prefill halves.
PROMPT_ROWS = (48, 64, 96, 128, 192, 256, 384, 512)
TIMED_ROWS = KERNEL_ROWS + PROMPT_ROWS
KERNEL_MARGIN = 0.03                  # oneDNN must win by 3%: a near-tie stays on stock F.linear


def kernel_key(model, rows=TIMED_ROWS) -> dict:
    """What a kernel choice depends on: the CPU, threads, library versions and the model's
    Linear shapes (not its path: models of one architecture share a choice)."""
    import torch

    from redwood.models.cpu_kernels import linear_shapes

    return {"kind": "kernel_choice", "cpu": cpu_model(), "threads": torch.get_num_threads(),
            "shapes": linear_shapes(model), "rows": sorted(int(n) for n in rows),
            "versions": {"redwood": _version("redwood"), "torch": torch.__version__}}


def choose_linear_rows(model, rows=TIMED_ROWS, cache_dir=None, progress: bool = True,
                       measure=None) -> frozenset[int]:
    """The row counts (of `rows`) whose Linear work is faster through oneDNN than through
    F.linear on this machine, for this model's shapes: timed once (a few seconds), cached
    under $REDWOOD_CACHE/profiles/kernels/, reused while kernel_key matches. Route them with
    cpu_kernels.apply_kernel_choice(model, chosen, timed=rows): a count that was not timed (a
    prompt's length) goes the way of the nearest timed one.
    `measure(model, rows, progress)` -> {n: {"f_linear": ms, "onednn": ms}}
    replaces the timing (tests). Empty without oneDNN or float32 Linear layers."""
    from redwood.models.cpu_kernels import fast_linear_available, linear_shapes

    if not fast_linear_available() or not linear_shapes(model):
        return frozenset()
    key = kernel_key(model, rows)
    directory = profile_dir(cache_dir) / "kernels"

    def make(path: Path) -> frozenset[int]:
        timings = (measure or _time_kernels)(model, key["rows"], progress)
        chosen = frozenset(n for n, t in timings.items()
                           if t["onednn"] < (1 - KERNEL_MARGIN) * t["f_linear"])
        path.write_text(json.dumps({**key, "onednn_rows": sorted(chosen),
                                    "ms": {str(n): t for n, t in sorted(timings.items())}}, indent=1))
        return chosen

    announce = (f"redwood: timing F.linear vs oneDNN for {len(key['rows'])} row counts on "
                f"{sum(s[3] for s in key['shapes'])} Linear layers (first use on {key['cpu']}; "
                f"cached in {directory})") if progress else ""
    chosen = cached(directory, key, _load_kernel_choice, make, announce)
    if progress:
        print(f"redwood: oneDNN for {routing_text(chosen) or 'no'} rows, F.linear elsewhere",
              file=sys.stderr, flush=True)
    return chosen


def use_fastest_linear(model, cache_dir=None, progress: bool = True) -> frozenset[int]:
    """choose_linear_rows, then route the model by it; returns the oneDNN rows."""
    from redwood.models.cpu_kernels import apply_kernel_choice

    rows = choose_linear_rows(model, cache_dir=cache_dir, progress=progress)
    apply_kernel_choice(model, rows, timed=TIMED_ROWS)
    return rows


def choose_kernels(target, draft, progress: bool = True) -> dict:
    """Route each float32 CPU model's Linear layers, per row count, to whichever of F.linear
    and oneDNN this machine measured faster (measure.machine_profile.choose_linear_rows,
    cached). Returns {"target": rows, "draft": rows} sent to oneDNN."""
    import torch

    chosen = {}
    for name, model in (("target", target), ("draft", draft)):
        weight = next(model.parameters(), None) if isinstance(model, torch.nn.Module) else None
        if weight is None or weight.device.type != "cpu" or weight.dtype != torch.float32:
            continue
        chosen[name] = use_fastest_linear(model, progress=progress)
    return chosen


def _time_kernels(model, rows, progress) -> dict:
    from redwood.models.cpu_kernels import time_linear_kernels

    def report(done, rounds):
        print(f"  kernel timing round {done}/{rounds}" + (" (warm-up)" if done == 0 else ""),
              file=sys.stderr, flush=True)

    timings = time_linear_kernels(model, rows, progress=report if progress else None)
    if progress:
        print("  rows: F.linear / oneDNN ms: " + ", ".join(
            f"{n}: {t['f_linear']:.1f}/{t['onednn']:.1f}" for n, t in timings.items()),
              file=sys.stderr, flush=True)
    return timings


def _load_kernel_choice(path: Path, key: dict) -> frozenset[int] | None:
    """The cached choice at `path` if it was measured under exactly `key` (else None)."""
    try:
        data = json.loads(path.read_text())
        if {k: data.get(k) for k in key} == key:
            return frozenset(int(n) for n in data["onednn_rows"])
    except (OSError, ValueError, KeyError, TypeError):    # missing or damaged: measure again
        pass
    return None


def routing_text(chosen) -> str:
    """{1..32, 48..512} -> '1-32 and prompts (33+ rows)': which inputs go to oneDNN."""
    small = row_ranges(n for n in chosen if n <= KERNEL_ROWS[-1])
    long = [n for n in PROMPT_ROWS if n in chosen]
    if len(long) == len(PROMPT_ROWS):
        tail = f"prompts ({KERNEL_ROWS[-1] + 1}+ rows)"
    else:
        tail = f"prompts near {', '.join(map(str, long))} rows" if long else ""
    return " and ".join(part for part in (small, tail) if part)


def row_ranges(rows) -> str:
    """{1, 2, 3, 7} -> '1-3, 7'."""
    out, rows = [], sorted(rows)
    for n in rows:
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in out)


def replan(bundle, temperature: float, profile: Profile, draft_confidence: float | None = None):
    """(tree, draft_confidence) for `temperature` from the bundle's acceptance vector planned
    against this machine's `profile` (same budget and depth limits as the bundle's own plan).
    draft_confidence as in Bundle.drafting: None = adaptive with the estimated threshold
    (or the bundle's measured one), 0 = the static tree."""
    from redwood.plan.adaptive import plan_adaptive
    from redwood.plan.formats import Acceptance
    from redwood.plan.planner import choose_tree

    entry = bundle.entry(temperature)
    acceptance = Acceptance.load(bundle.directory / entry.acceptance)
    settings = bundle.index.get("settings", {})
    max_budget = min(int(settings.get("max_budget", 32)), max(profile.target_ms))
    max_depth = int(settings.get("max_depth", 16))
    static = choose_tree(acceptance, profile, max_budget, max_depth)
    static.tree.source.update({"bundle": str(bundle.directory), "bundle_temperature": entry.temperature,
                               "profile": "this machine (first-use profile)"})
    if draft_confidence == 0 or not entry.adaptive_tree:
        return static.tree, 0.0
    measured = entry.draft_confidence if entry.threshold_from == "given" else None
    given = draft_confidence if draft_confidence is not None else measured
    plan = plan_adaptive(acceptance.p, profile, static, max_budget, max_depth, given)
    plan.tree.source.update(static.tree.source)
    return plan.tree, float(plan.draft_confidence)


def _model_id(backend) -> dict:
    name = getattr(backend, "name", "")
    size = None
    try:
        size = os.path.getsize(name) if name and os.path.isfile(name) else None
    except OSError:
        pass
    return {"name": str(name), "bytes": size, "dtype": getattr(backend, "dtype_name", "")}


def _routed_rows(backend) -> list[int] | None:
    """The row counts a transformers backend's model sends to oneDNN (None: stock F.linear)."""
    from torch import nn

    from redwood.models.cpu_kernels import onednn_rows

    model = getattr(backend, "model", None)
    rows = onednn_rows(model) if isinstance(model, nn.Module) else None
    return None if rows is None else list(rows)


def _threads(backend) -> int:
    if getattr(backend, "n_threads", None):
        return int(backend.n_threads)
    import torch

    return torch.get_num_threads()


def _llama_build_id() -> str:
    """Which build of llama.cpp's libraries is installed (the same version built for other
    instruction sets runs at other speeds): a digest of their names and sizes."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return "none"
    lib = Path(spec.origin).parent / "lib"
    files = sorted(lib.glob("*.so*")) + sorted(lib.glob("*.dylib")) if lib.is_dir() else []
    text = ";".join(f"{f.name}:{f.stat().st_size}" for f in files)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
