"""Choose the adaptive drafting settings: max tree x draft_confidence, measured on
calibration-split prompts (never the evaluation split the bench reports on).

    python benchmarks/draft_confidence_sweep.py                       # shipped pair
    python benchmarks/draft_confidence_sweep.py --prompts 3 --first-prompt 5 \\
        --temperatures 1.0 0 --thresholds 0.6 0.8

For each temperature the static tuned tree, deep chains and DP trees of larger budgets run with
each threshold, interleaved per prompt with redwood's autoregressive loop and transformers'
default assisted generation (the schedule to beat). Prints tokens/s ratios against
autoregressive and writes benchmarks/results/draft-confidence-<machine>-<date>.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def candidate_trees(bundle, temperature: float, budgets, chain_lengths):
    """(label, tree) pairs: the bundle's static tree, chains, and DP trees for larger budgets
    from the bundle's acceptance vector at this temperature."""
    from redwood.plan.formats import load_acceptance
    from redwood.plan.planner import optimal_tree
    from redwood.plan.tree import chain

    entry = bundle.entry(temperature)
    trees = [(f"tuned n={len(bundle.tree(temperature))}", bundle.tree(temperature))]
    trees += [(f"chain {n}", chain(n)) for n in chain_lengths]
    p = load_acceptance(bundle.directory / entry.acceptance).p
    trees += [(f"dp n={n}", optimal_tree(p, n, min(n, 16))) for n in budgets]
    return trees


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.6])
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.4, 0.6, 0.8])
    parser.add_argument("--chains", type=int, nargs="*", default=[16])
    parser.add_argument("--budgets", type=int, nargs="*", default=[],
                        help="also DP trees of these budgets (from the bundle's vectors)")
    parser.add_argument("--first-prompt", type=int, default=0,
                        help="first calibration problem to use (default 0)")
    parser.add_argument("--out-dir", default=str(RESULTS))
    args = parser.parse_args(argv)

    import torch

    from redwood.bench.common import machine_name
    from redwood.bench.runners import AssistantSchedule, Setting, hf_runner, redwood_runner
    from redwood.decode.engine import Engine
    from redwood.models.pair import load_pair
    from redwood.measure.bundles import find_bundle
    from redwood.prompts import encode_prompt, humaneval_prompts
    from redwood.plan.tree import chain

    bundle = find_bundle("auto", "qwen2.5-coder")
    target, draft, tokenizer = load_pair("qwen2.5-coder", draft_quantize=bundle.draft_quantize,
                                         fast_linear=bundle.fast_linear)
    prompts = [encode_prompt(tokenizer, text) for text in
               humaneval_prompts("calibration")[args.first_prompt:args.first_prompt + args.prompts]]
    engine = Engine(target, draft, chain(2))
    rows = []
    for temperature in args.temperatures:
        setting = Setting(temperature, 1.0)
        runners = {"autoregressive": redwood_runner(engine, "autoregressive"),
                   "hf_assisted_default": hf_runner(target, draft, AssistantSchedule())}
        for label, tree in candidate_trees(bundle, temperature, args.budgets, args.chains):
            tree_engine = Engine(target, draft, tree)
            if label.startswith("tuned"):          # the deep trees only make sense pruned
                runners[f"{label} static"] = redwood_runner(tree_engine, "sequoia")
                continue
            for threshold in args.thresholds:
                runners[f"{label} c={threshold}"] = redwood_runner(tree_engine, "sequoia", threshold)
        runners["autoregressive"](prompts[0][:16], setting, 0, 4)       # warm-up
        measured = {name: [] for name in runners}
        for index, ids in enumerate(prompts):
            for name, run in runners.items():
                m = run(ids, setting, index, args.max_new_tokens)
                measured[name].append(m)
                print(f"T={temperature} prompt {index} {name:28s} {m.tokens_per_second:6.2f} tok/s "
                      f"{m.tokens_per_step:5.2f} tok/step", flush=True)
        base = statistics.mean(m.tokens_per_second for m in measured["autoregressive"])
        for name, ms in measured.items():
            rate = statistics.mean(m.tokens_per_second for m in ms)
            rows.append({"temperature": temperature, "config": name, "tokens_per_second": rate,
                         "speedup_vs_autoregressive": rate / base,
                         "tokens_per_step": statistics.mean(m.tokens_per_step for m in ms),
                         "draft_forwards_per_step": statistics.mean(
                             m.draft_forwards / max(m.target_forwards, 1) for m in ms)})
    print("\n| T | config | tok/s | vs autoregressive | tokens/step | draft forwards/step |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['temperature']:g} | {r['config']} | {r['tokens_per_second']:.2f} | "
              f"{r['speedup_vs_autoregressive']:.2f}x | {r['tokens_per_step']:.2f} | "
              f"{r['draft_forwards_per_step']:.2f} |")
    out = Path(args.out_dir) / (f"draft-confidence-{machine_name()}-{datetime.date.today()}-"
                                f"{'-'.join(f'{t:g}' for t in args.temperatures)}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"command": "python benchmarks/draft_confidence_sweep.py " + " ".join(argv or []),
              "prompts": f"humaneval calibration split, problems {args.first_prompt}.."
                         f"{args.first_prompt + args.prompts - 1}",
              "max_new_tokens": args.max_new_tokens, "torch_threads": torch.get_num_threads(),
              "rows": rows}
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
