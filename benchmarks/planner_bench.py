"""Time the planner's DP against a plain-Python loop version of the same recurrence.

    .venv/bin/python benchmarks/planner_bench.py [--loop-max 256] [--repeats 3]

Sizes (budget n, max depth d, width W): (128, 10, 32), (256, 16, 32), (1024, 32, 32).
Three implementations, all in this process, all giving the same table G(n, d):
- `dp_table`              : the planner as shipped (vectorised; exact size bound k <= (m-1)/b
                            on the last child's subtree, active because p is non-increasing);
- `dp_table(bound=False)` : the same vectorised code searching every split, i.e. vectorisation
                            alone, no bound;
- `reference_values`      : the recurrence in nested Python loops, (d-1) W n(n-1)/2 inner steps
                            (the yardstick). It runs only for n <= --loop-max; above that its
                            time is *extrapolated* from the largest measured size by that step
                            count, and the table marks it "(est.)".
Writes benchmarks/results/planner_bench.json (raw) and planner_bench.md (the table).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from redwood.plan.planner import dp_table, reference_values  # noqa: E402

SIZES = [(128, 10, 32), (256, 16, 32), (1024, 32, 32)]
RESULTS = Path(__file__).resolve().parent / "results"


def bench_p(width: int) -> np.ndarray:
    """A realistic non-increasing acceptance vector: the sample's head, a geometric tail."""
    head = [0.91, 0.05, 0.015, 0.008]
    tail = [0.003 * 0.75 ** i for i in range(width - len(head))]     # sum(p) < 0.996
    return np.array((head + tail)[:width])


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def loop_steps(n: int, d: int, w: int) -> int:
    return (d - 1) * w * n * (n - 1) // 2


def run(loop_max: int, repeats: int) -> list[dict]:
    rows, per_step = [], None
    for n, d, w in SIZES:
        p = bench_p(w)
        reps = repeats if n <= 256 else max(1, repeats // 2)
        fast_s, table = timed(lambda: dp_table(p, n, d), reps)
        plain_s, plain = timed(lambda: dp_table(p, n, d, size_bound=False), reps)
        row = {"n": n, "d": d, "W": w, "vectorised_s": fast_s, "vectorised_no_bound_s": plain_s,
               "G": float(table.values[n, d]),
               "max_abs_diff_bound_vs_no_bound": _max_diff(table.values, plain.values)}
        if n <= loop_max:
            loop_s, slow = timed(lambda: reference_values(p, n, d), 1)
            per_step = loop_s / loop_steps(n, d, w)
            row.update(loop_s=loop_s, loop_estimated=False,
                       max_abs_diff_vs_loop=_max_diff(table.values, np.array(slow)))
        else:
            row.update(loop_s=per_step * loop_steps(n, d, w), loop_estimated=True,
                       max_abs_diff_vs_loop=None)
        row["ratio"] = row["loop_s"] / fast_s
        row["ratio_no_bound"] = row["loop_s"] / plain_s
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    finite = np.isfinite(a)
    assert np.array_equal(finite, np.isfinite(b)), "feasibility differs"
    return float(np.abs(a[finite] - b[finite]).max())


HEADER = ("| n | d | W | vectorised (s) | no bound (s) | loop (s) | loop / vectorised "
          "| loop / no bound | max diff |")


def _line(r: dict) -> str:
    est = " (est.)" if r["loop_estimated"] else ""
    diff = "n/a" if r["max_abs_diff_vs_loop"] is None else f"{r['max_abs_diff_vs_loop']:.1e}"
    return (f"| {r['n']} | {r['d']} | {r['W']} | {r['vectorised_s']:.4f} | "
            f"{r['vectorised_no_bound_s']:.4f} | {r['loop_s']:.2f}{est} | "
            f"{r['ratio']:.0f}x{est} | {r['ratio_no_bound']:.0f}x{est} | {diff} |")


def machine() -> dict:
    return {"python": platform.python_version(), "numpy": np.__version__,
            "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "load_average_before": os.getloadavg(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop-max", type=int, default=256,
                        help="largest n at which the loop version runs (larger: extrapolated)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per vectorised timing (median)")
    args = parser.parse_args()
    info = machine()
    print(f"load average before: {info['load_average_before']}")
    print(HEADER)
    print("|" + "---|" * 9)
    rows = run(args.loop_max, args.repeats)
    info["load_average_after"] = os.getloadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "planner_bench.json").write_text(json.dumps(
        {"machine": info, "p": bench_p(32).tolist(), "loop_max": args.loop_max,
         "rows": rows}, indent=1) + "\n")
    md = ["# Planner DP benchmark", "",
          f"Machine: {info['cpus']} CPUs, Python {info['python']}, numpy {info['numpy']}; "
          f"load average before/after {info['load_average_before'][0]:.2f}/"
          f"{info['load_average_after'][0]:.2f}; {info['time']}.", "",
          "Median seconds for one DP pass giving G(n, d) for all n <= budget, d <= max depth. "
          "`no bound` = the same vectorised code searching every split; `loop` = plain-Python "
          "loops over the same recurrence; (est.) = loop time extrapolated from the largest "
          "measured n by the (d-1) W n(n-1)/2 step count, not measured. `max diff` = largest "
          "|G difference| between the vectorised and loop tables.", "",
          HEADER, "|" + "---|" * 9] + [_line(r) for r in rows]
    (RESULTS / "planner_bench.md").write_text("\n".join(md) + "\n")
    print(f"wrote {RESULTS / 'planner_bench.json'} and planner_bench.md")


if __name__ == "__main__":
    main()
