"""Target forward latency for n = 1..16 new tokens over a 256-token cache, stock F.linear vs
redwood's oneDNN fast linear (models.load_model(..., fast_linear=True)), interleaved per
repetition so machine drift (other processes) hits both alike; min and median reported.

With --choose the fast configuration is the per-row-count kernel choice of
measure/machine_profile.choose_linear_rows: the Linear-shape timings it makes (F.linear vs
oneDNN per row count) are reported as "kernel_ms", and the full forwards check that the
chosen routing is as fast as predicted.

    python benchmarks/fast_linear.py --role target --reps 5 --out benchmarks/results/fast_linear.json
    python benchmarks/fast_linear.py --choose --n 1 2 3 4 8 16 --reps 3
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import torch


def timed_forward(model, ids, cache, context: int) -> tuple[float, float, torch.Tensor]:
    """(wall ms, process CPU ms, logits). With one thread, CPU time is what the forward costs
    with the machine to itself: it excludes time spent descheduled by other processes."""
    positions = torch.arange(context, context + ids.shape[1]).unsqueeze(0)
    start, start_cpu = time.perf_counter(), time.process_time()
    logits = model(input_ids=ids, cache=cache, position_ids=positions, use_cache=True).logits
    elapsed = (time.perf_counter() - start) * 1e3
    cpu = (time.process_time() - start_cpu) * 1e3
    cache.crop(-ids.shape[1])
    return elapsed, cpu, logits


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["target", "draft"], default="target")
    parser.add_argument("--path")
    parser.add_argument("--n", type=int, nargs="+", default=list(range(1, 17)))
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rows", type=int, nargs=2, default=None,
                        help="row range for the fast path (default: fastlinear.DEFAULT_ROWS)")
    parser.add_argument("--choose", action="store_true",
                        help="route the row counts that time faster through oneDNN on this "
                        "machine's Linear shapes (rows 1..32), as choose_linear_rows does")
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    from transformers import DynamicCache

    from redwood.models.cpu_kernels import DEFAULT_ROWS
    from redwood.models.hf_loading import load_model
    from redwood.models.shipped import shipped_model_dir

    path = args.path or shipped_model_dir(args.role)
    model = load_model(path)
    routing, kernel_ms = tuple(args.rows or DEFAULT_ROWS), None
    if args.choose:
        routing, kernel_ms = choose_rows(model)
    generator = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=model.config)
    rows = {}
    with torch.inference_mode():
        prompt = torch.randint(0, model.config.vocab_size, (1, args.context), generator=generator)
        model(input_ids=prompt, cache=cache, use_cache=True)
        for n in args.n:
            ids = torch.randint(0, model.config.vocab_size, (1, n), generator=generator)
            rows[n] = compare_kernels(model, ids, cache, args.context, args.reps, routing)
            print(n, json.dumps(rows[n]), flush=True)
    result = {"path": str(path), "rows": sorted(routing) if args.choose else list(routing),
              "kernel_ms": kernel_ms, "context": args.context, "threads": torch.get_num_threads(),
              "reps": args.reps, "forward_ms": rows,
              "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
              # other processes on the machine skew wall-clock times; keep the context
              "load_average_1min_at_end": round(os.getloadavg()[0], 2)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def compare_kernels(model, ids, cache, context: int, reps: int, routing) -> dict:
    """Stock vs routed forward of `ids`, interleaved per repetition (rep 0 warms up both)."""
    from redwood.models.cpu_kernels import disable_fast_linear, enable_fast_linear

    times = {"stock": [], "fast": [], "stock_cpu": [], "fast_cpu": []}
    diffs = []
    for rep in range(reps + 1):
        disable_fast_linear(model)
        t_stock, c_stock, stock = timed_forward(model, ids, cache, context)
        enable_fast_linear(model, rows=routing)
        t_fast, c_fast, fast = timed_forward(model, ids, cache, context)
        if rep:
            for key, value in (("stock", t_stock), ("fast", t_fast),
                               ("stock_cpu", c_stock), ("fast_cpu", c_fast)):
                times[key].append(value)
        diffs.append((stock - fast).abs().max().item())
    row = {k: {"min": round(min(v), 1), "median": round(statistics.median(v), 1)}
           for k, v in times.items()}
    row["max_logit_diff"] = max(diffs)
    row["same_argmax"] = bool(torch.equal(stock.argmax(-1), fast.argmax(-1)))
    return row


def choose_rows(model) -> tuple[frozenset, dict]:
    """(oneDNN rows, {n: {"f_linear": ms, "onednn": ms}}) by choose_linear_rows' rule, timed
    afresh (not read from the cache) so the numbers are this run's."""
    from redwood.measure.machine_profile import KERNEL_MARGIN, KERNEL_ROWS
    from redwood.models.cpu_kernels import time_linear_kernels

    start = time.perf_counter()
    timings = time_linear_kernels(model, KERNEL_ROWS)
    rows = frozenset(n for n, t in timings.items() if t["onednn"] < (1 - KERNEL_MARGIN) * t["f_linear"])
    print(f"kernel timing {time.perf_counter() - start:.1f} s; oneDNN rows {sorted(rows)}", flush=True)
    for n, t in timings.items():
        print(f"  {n:2d} rows: F.linear {t['f_linear']:.1f} ms, oneDNN {t['onednn']:.1f} ms", flush=True)
    return rows, timings


if __name__ == "__main__":
    main()
