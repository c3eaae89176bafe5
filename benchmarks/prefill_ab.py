"""The fused first verification, A/B (`engine_overhead.py --prefill`; docs/design.md §5.4).

A speculative request's target work from its start up to the first verified tree, two routes:
- separate: reset, append(prompt[:-1], rows=0), then run_tree over the first tree (two forwards);
- fused:    reset, prefill_tree(prompt[:-1], tree, tokens) (one forward, head on the tree rows).
The draft side (its prefill, drafting the first tree) is the same in both routes and is not
timed; the tree's tokens are random (the cost does not depend on them). Each (prompt length,
tree size) runs both routes once untimed, then `repeats` times interleaved in random order so
machine load hits both alike; rows give median and min ms and the max |logit diff| between the
routes' tree logits.
"""
from __future__ import annotations

import random
import time

import torch

ROUTES = ("separate", "fused")


def time_route(backend, route: str, prompt: torch.Tensor, tree, tokens: torch.Tensor):
    """(seconds, tree logits [n, V]) of one route from an emptied cache; the tentative nodes
    are dropped afterwards (not timed)."""
    with torch.inference_mode():
        start = time.perf_counter()
        backend.reset()
        if route == "fused":
            logits = backend.prefill_tree(prompt[:-1], tree, tokens)
        else:
            backend.append(prompt[:-1], rows=0)
            logits = backend.run_tree(tree, range(len(tree)), tokens, backend.cache_length())
        if logits.device.type == "cuda":
            torch.cuda.synchronize(logits.device)
        seconds = time.perf_counter() - start
        backend.keep_path([])
    return seconds, logits


def prefill_rows(model, lengths, trees: dict, repeats: int, seed: int = 0) -> list[dict]:
    """One row per (prompt length, tree size): both routes' times and the saving.
    trees: {n: Tree of n nodes}."""
    from redwood.backends.hf import HFBackend

    backends = {route: HFBackend(model) for route in ROUTES}     # one cache each, same model
    vocab = backends["fused"].vocab_size
    gen = torch.Generator().manual_seed(seed)
    prompts = {length: torch.randint(0, vocab, (length,), generator=gen) for length in lengths}
    tokens = {n: torch.randint(0, vocab, (n,), generator=gen) for n in trees}
    cells = [(length, n) for length in lengths for n in trees]
    times = {(cell, route): [] for cell in cells for route in ROUTES}
    logits = {}
    for length, n in cells:                                       # warm-up, and the logits
        for route in ROUTES:
            _, logits[(length, n), route] = time_route(backends[route], route, prompts[length],
                                                       trees[n], tokens[n])
    order = random.Random(seed)
    for _ in range(repeats):
        for length, n in cells:
            routes = list(ROUTES)
            order.shuffle(routes)
            for route in routes:
                seconds, _ = time_route(backends[route], route, prompts[length], trees[n], tokens[n])
                times[(length, n), route].append(1000.0 * seconds)
    rows = []
    for cell in cells:
        stats = {route: _summary(times[cell, route]) for route in ROUTES}
        diff = (logits[cell, "fused"] - logits[cell, "separate"]).abs().max()
        saving = stats["separate"]["median_ms"] - stats["fused"]["median_ms"]
        rows.append({"prompt_tokens": cell[0], "nodes": cell[1], **stats,
                     "saving_median_ms": saving,
                     "saving_pct": 100.0 * saving / stats["separate"]["median_ms"],
                     "max_abs_logit_diff": float(diff)})
    return rows


def _summary(ms: list[float]) -> dict:
    return {"median_ms": sorted(ms)[len(ms) // 2], "min_ms": min(ms), "all_ms": ms}


def prefill_table(rows) -> str:
    lines = [f"{'prompt':>7}{'n':>4}  {'separate med/min ms':>20}  {'fused med/min ms':>17}"
             f"{'saving ms':>11}{'saving':>8}{'max|diff|':>11}"]
    for r in rows:
        a, b = r["separate"], r["fused"]
        lines.append(f"{r['prompt_tokens']:>7}{r['nodes']:>4}  "
                     f"{a['median_ms']:>10.1f} / {a['min_ms']:<7.1f}  "
                     f"{b['median_ms']:>8.1f} / {b['min_ms']:<6.1f}"
                     f"{r['saving_median_ms']:>11.1f}{r['saving_pct']:>+7.1f}%"
                     f"{r['max_abs_logit_diff']:>11.1e}")
    return "\n".join(lines)


def main(args, argv, forward_model, run_ab, heap_tree) -> dict:
    """engine_overhead.py --prefill: measure, print the table, write the JSON.
    forward_model(args) -> (model, label): engine_overhead's shipped-or-random target; run_ab,
    heap_tree: engine_overhead's A/B runner and trees."""
    if args.quick:
        from redwood.models.tiny_random import tiny_pair

        torch.set_num_threads(1)
        model, label = tiny_pair()[0], "quick-tiny target (redwood.models.tiny_random.tiny_pair)"
    else:
        model, label = forward_model(args)
    trees = {n: heap_tree(n) for n in args.nodes or [4, 16]}
    routes = {"separate": "append(prompt[:-1], rows=0) + run_tree",
              "fused": "prefill_tree(prompt[:-1], tree, tokens)"}
    return run_ab("prefill-fusion-ab", label,
                  lambda: prefill_rows(model, args.lengths, trees, args.repeats, args.seed),
                  prefill_table, args, argv, machine="quick" if args.quick else None,
                  routes=routes)
