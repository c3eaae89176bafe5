"""Where one decoding step's time goes: target forward, draft forwards, everything else.

    python benchmarks/engine_overhead.py                    # shipped pair, 2 prompts x 64 tokens, greedy
    python benchmarks/engine_overhead.py --tree auto --temperature 0.6
    python benchmarks/engine_overhead.py --quick            # tiny random pair, seconds

Per step (one target forward), from two independent sources:
- the engine's own split (GenerationResult.stats): target / draft / other, where "draft"
  is all of DraftModelDrafter.propose (its forwards and choosing children);
- forward hooks on both models (time inside each model's forward) and timers wrapped around
  the engine's helper functions (sampling, verification, masks, cache compaction), so
  "everything else" = step - target forward - draft forwards is split into named parts.
Goal (engine issue): everything else <= 10% of a step on the shipped pair.
Prefill is excluded. Prints a table; writes JSON under benchmarks/results/.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
# (module, attribute): the helper functions of a step, timed by wrapping them in place.
HELPERS = [("redwood.decode.sampling", "process_logits"), ("redwood.decode.sampling", "propose_children"),
           ("redwood.decode.sampling", "greedy_children"), ("redwood.decode.sampling", "sample_token"),
           ("redwood.decode.verify", "verify_greedy"), ("redwood.decode.verify", "verify_tree"),
           ("redwood.backends.hf_cache", "tree_attention_mask"), ("redwood.backends.hf_cache", "keep_tail"),
           ("redwood.decode.draft_model", "DraftModelDrafter.commit")]


@contextmanager
def timed_helpers(totals: dict):
    """Wrap each helper so its calls add their seconds to totals[name]; restore afterwards."""
    import importlib

    originals = []
    for module_name, attr in HELPERS:
        owner = importlib.import_module(module_name)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        if not hasattr(owner, name):
            continue
        original = getattr(owner, name)
        label = attr.split(".")[-1]
        totals.setdefault(label, 0.0)

        def wrapper(*args, _original=original, _label=label, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                totals[_label] += time.perf_counter() - start

        setattr(owner, name, wrapper)
        originals.append((owner, name, original))
    try:
        yield totals
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def measure(engine, prompts, method, max_new_tokens, temperature, seed) -> dict:
    """Run `method` on every prompt with hooks and helper timers; per-step milliseconds."""
    from redwood.bench.runners import ForwardTimer

    totals: dict = {}
    steps = tokens = 0
    engine_split = {"target": 0.0, "draft": 0.0, "other": 0.0}
    forward = {"target": 0.0, "draft": 0.0}
    with ExitStack() as stack:
        timers = {"target": stack.enter_context(ForwardTimer(engine.target)),
                  "draft": stack.enter_context(ForwardTimer(engine.draft))}
        stack.enter_context(timed_helpers(totals))
        for i, ids in enumerate(prompts):
            first = {name: timer.calls for name, timer in timers.items()}
            result = engine.generate(ids, max_new_tokens, temperature=temperature, seed=seed + i,
                                     method=method, stop_on_eos=False)
            for name, timer in timers.items():
                calls = timer.durations[first[name]:]
                # the first call of each model in a generation is its prefill (prompt[:-1])
                forward[name] += sum(calls[1:]) if len(ids) > 1 and calls else sum(calls)
            steps += result.stats.target_forwards
            tokens += len(result.tokens)
            for part in engine_split:
                engine_split[part] += getattr(result.stats, f"{part}_seconds")
    step_seconds = sum(engine_split.values())
    nodes = 1 if method == "autoregressive" else len(engine.tree)
    return {"method": method, "tree_nodes": nodes, "steps": steps, "tokens": tokens,
            "tokens_per_step": tokens / steps, "step_ms": 1000.0 * step_seconds / steps,
            "tokens_per_second": tokens / step_seconds,
            "engine_split_ms": {k: 1000.0 * v / steps for k, v in engine_split.items()},
            "target_forward_ms": 1000.0 * forward["target"] / steps,
            "draft_forwards_ms": 1000.0 * forward["draft"] / steps,
            "everything_else_ms": 1000.0 * (step_seconds - sum(forward.values())) / steps,
            "helpers_ms": {k: 1000.0 * v / steps for k, v in totals.items() if v > 0}}


def table(rows) -> str:
    lines = [f"{'method':<15}{'nodes':>6}{'tok/step':>9}{'step ms':>9}{'target':>9}{'draft':>9}"
             f"{'else':>9}{'else %':>8}   engine split target/draft/other ms"]
    for r in rows:
        split = r["engine_split_ms"]
        lines.append(f"{r['method']:<15}{r['tree_nodes']:>6}{r['tokens_per_step']:>9.2f}"
                     f"{r['step_ms']:>9.1f}{r['target_forward_ms']:>9.1f}"
                     f"{r['draft_forwards_ms']:>9.1f}{r['everything_else_ms']:>9.1f}"
                     f"{100 * r['everything_else_ms'] / r['step_ms']:>7.1f}%   "
                     f"{split['target']:.1f} / {split['draft']:.1f} / {split['other']:.1f}")
        helpers = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["helpers_ms"].items(),
                                                                key=lambda kv: -kv[1]))
        lines.append(f"{'':<15}helpers (ms/step, inside the parts above): {helpers}")
    return "\n".join(lines)


def load(args):
    """(engine, prompts, pair label) for the shipped pair or the tiny quick pair."""
    from redwood.decode.engine import Engine
    from redwood.measure.bundles import find_bundle, resolve_tree
    from redwood.prompts import humaneval_prompts

    if args.quick:
        from redwood.bench.inputs import quick_pair

        torch.set_num_threads(1)
        pair = quick_pair()
        tree = resolve_tree(args.tree, args.temperature, None) if args.tree else None
    else:
        from redwood.bench.inputs import load_models
        from redwood.cli.textgen import ModelConfig

        pair = load_models(ModelConfig(backend="hf", draft_quantize=args.draft_quantize,
                                       fast_linear=args.fast_linear), find_bundle(args.tree, "qwen2.5-coder"))
        tree = resolve_tree(args.tree, args.temperature)
    prompts = pair.encode(humaneval_prompts("evaluation", limit=args.prompts))
    return Engine(pair.target, pair.draft, tree), prompts, pair.name


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--tree", default=None, help="tree JSON, bundle dir or 'auto' "
                        "(default: the tree shipped with redwood)")
    parser.add_argument("--methods", nargs="+", default=["sequoia", "autoregressive"])
    parser.add_argument("--draft-quantize", choices=["int8"], default=None)
    parser.add_argument("--fast-linear", action="store_true",
                        help="oneDNN for small-row float32 matmuls (as `redwood --fast-linear`)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny random pair (seconds)")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/"
                        "engine-overhead-<machine>-<date>.json)")
    args = parser.parse_args(argv)
    from redwood.bench.common import machine_name

    engine, prompts, pair_name = load(args)
    engine.generate(prompts[0], 8, temperature=args.temperature, seed=0,
                    method=args.methods[0], stop_on_eos=False)           # warm-up
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    rows = [measure(engine, prompts, method, args.max_new_tokens, args.temperature, args.seed)
            for method in args.methods]
    report = {"format": 1, "kind": "engine-overhead", "models": pair_name,
              "machine": "quick" if args.quick else machine_name(),
              "date": datetime.date.today().isoformat(),
              "command": " ".join(["python benchmarks/engine_overhead.py", *(argv or sys.argv[1:])]),
              "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "temperature": args.temperature, "tree_parents": engine.tree.parents,
              "threads": torch.get_num_threads(), "elapsed_seconds": time.perf_counter() - started,
              "load_average_1min": {"start": load_start, "end": os.getloadavg()[0]},
              "goal": "everything else (step minus model forwards) <= 10% of a step",
              "rows": rows}
    print(table(rows))
    out = Path(args.out) if args.out else \
        RESULTS / f"engine-overhead-{report['machine']}-{report['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
