"""The engine issue's comparison: sequoia vs autoregressive vs `transformers` `generate`.

    python benchmarks/compare_hf.py                 # shipped pair, 5 prompts x 128 tokens, greedy
    python benchmarks/compare_hf.py --tree auto     # the tuned bundle's tree instead of the default
    python benchmarks/compare_hf.py --quick         # tiny random pair (seconds)

HumanEval evaluation-split prompts, greedy, EOS ignored, methods interleaved per prompt,
prefill excluded for every method (for `transformers` `generate`: a 1-token generate on the
same prompt is timed and subtracted, see redwood.bench.runners). It is `redwood bench` with
three methods and one setting: the same code, records and table. Prints the ratios; writes
benchmarks/results/compare-hf-<machine>-<date>.{json,raw.json,md}.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--tree", default=None,
                        help="tree JSON, bundle dir or 'auto' (default: redwood's default tree)")
    parser.add_argument("--acceptance", nargs="+", default=[],
                        help="acceptance vectors, only for the predicted tokens/step column")
    parser.add_argument("--draft-quantize", choices=["int8"], default=None)
    parser.add_argument("--fast-linear", action="store_true",
                        help="oneDNN for small-row float32 matmuls (as `redwood --fast-linear`)")
    parser.add_argument("--quick", action="store_true", help="tiny random pair (seconds)")
    parser.add_argument("--out-dir", default=str(RESULTS))
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)

    import transformers

    from redwood.bench.common import machine_name
    from redwood.bench.config import BenchConfig
    from redwood.bench.inputs import load_models, plan_inputs, quick_pair
    from redwood.bench.report import write_outputs
    from redwood.bench.run import run_bench
    from redwood.plan.formats import Acceptance
    from redwood.measure.bundles import find_bundle

    machine = "quick" if args.quick else machine_name()
    config = BenchConfig(
        prompts=args.prompts, max_new_tokens=args.max_new_tokens, temperatures=(0.0,),
        top_ps=(1.0,), methods=("autoregressive", "hf_generate", "sequoia"), select_prompts=0,
        out_dir=args.out_dir, machine=machine, plots=not args.no_plots, quick=args.quick,
        stem=f"compare-hf-{machine}-{datetime.date.today().isoformat()}",
        command=" ".join(["python benchmarks/compare_hf.py", *(argv or sys.argv[1:])]))
    config.check()
    for path in args.acceptance:                     # fail on a bad file before loading
        Acceptance.load(path)
    transformers.logging.set_verbosity_error()
    if args.quick:
        import torch

        torch.set_num_threads(1)
        pair = quick_pair()
    else:
        from redwood.cli.textgen import ModelConfig

        pair = load_models(ModelConfig(backend="hf", draft_quantize=args.draft_quantize,
                                       fast_linear=args.fast_linear), find_bundle(args.tree, "qwen2.5-coder"))
    tree = args.tree or _default_tree_path()
    inputs = plan_inputs(pair, args.acceptance, None, tree, measure_quick=False)
    report = run_bench(config, pair, inputs)
    paths = write_outputs(report)
    summary = json.loads(paths["summary"].read_text())
    print(ratio_lines(summary["summary"]))
    for path in paths.values():
        print(f"wrote {path}")
    return summary


def _default_tree_path() -> str:
    from importlib import resources

    return str(resources.files("redwood") / "data" / "default_tree.json")


def ratio_lines(rows) -> str:
    by = {r["method"]: r for r in rows}
    lines = [f"{m:<15} {r['config']:<12} {r['tokens_per_second']:7.2f} tok/s  "
             f"{r['tokens_per_step']:.2f} tok/step  {r['ms_per_token']:.0f} ms/token"
             for m, r in by.items()]
    seq, ar, hf = by["sequoia"], by["autoregressive"], by["hf_generate"]
    lines.append(f"sequoia / autoregressive: {seq['speedup_vs_autoregressive']:.2f}x;  "
                 f"sequoia / HF generate: {seq['speedup_vs_hf_generate']:.2f}x;  "
                 f"autoregressive / HF generate: {ar['speedup_vs_hf_generate']:.2f}x "
                 "(medians of per-prompt ratios)")
    same = seq["greedy_matches_autoregressive"] and hf["greedy_matches_autoregressive"]
    lines.append(f"greedy outputs identical to autoregressive: {'yes' if same else 'NO'}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
