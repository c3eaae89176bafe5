"""Where one decoding step's time goes: target forward, draft forwards, everything else.

    python benchmarks/engine_overhead.py                    # shipped pair, 2 prompts x 64 tokens, greedy
    python benchmarks/engine_overhead.py --tree auto --temperature 0.6
    python benchmarks/engine_overhead.py --quick            # tiny random pair, seconds
    python benchmarks/engine_overhead.py --stock-attention --stock-cache   # the stock HF path
    python benchmarks/engine_overhead.py --forwards         # target tree forward, A/B (below)
    python benchmarks/engine_overhead.py --prefill          # fused first verification, A/B
    python benchmarks/engine_overhead.py --prefill --quick  # the same on a tiny model, seconds

Per step (one target forward), from two independent sources:
- the engine's own split (GenerationResult.stats): target / draft / other, where "draft"
  is all of DraftModelDrafter.propose (its forwards and choosing children);
- forward hooks on both models (time inside each model's forward) and timers wrapped around
  the engine's helper functions (sampling, verification, masks, cache compaction), so
  "everything else" = step - target forward - draft forwards is split into named parts.
Goal (engine issue): everything else <= 10% of a step on the shipped pair.
Prefill is excluded (requests run with fuse_prefill=False, so the target's prefill stays a
forward of its own). Prints a table; writes JSON under benchmarks/results/.

--forwards: one target tree forward (run_tree over all n nodes, logits for all) at n in
--nodes over a --contexts-token cache, for each backend variant: stock (torch.cat DynamicCache +
transformers sdpa with repeat_kv), gqa (redwood_sdpa: no K/V head copy), prealloc (cache
written by position), both. All variants share one model and identical cache contents, run
interleaved in one process (variant order shuffled each repeat) so machine load hits all
alike; reports median and min ms, /proc/loadavg, and each variant's max |logit diff| vs stock.

--prefill: a request's target work up to its first verified tree, append(prompt[:-1]) then
run_tree vs one prefill_tree forward (docs/design.md §5.4), at --lengths prompt tokens and
--nodes tree sizes, interleaved per repeat (benchmarks/prefill_ab.py); the shipped target (or
--random-target, or --quick's tiny target).
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


def torch_module(model_or_backend):
    """The torch model to hook: an HFBackend's model (wrap_backends), else what was given."""
    model = getattr(model_or_backend, "model", None)
    return model if isinstance(model, torch.nn.Module) else model_or_backend


def measure(engine, prompts, method, max_new_tokens, temperature, seed) -> dict:
    """Run `method` on every prompt with hooks and helper timers; per-step milliseconds."""
    from redwood.bench.runners import ForwardTimer

    totals: dict = {}
    steps = tokens = 0
    engine_split = {"target": 0.0, "draft": 0.0, "other": 0.0}
    forward = {"target": 0.0, "draft": 0.0}
    with ExitStack() as stack:
        timers = {name: stack.enter_context(ForwardTimer(torch_module(getattr(engine, name))))
                  for name in ("target", "draft")}
        stack.enter_context(timed_helpers(totals))
        for i, ids in enumerate(prompts):
            first = {name: timer.calls for name, timer in timers.items()}
            # a separate prefill forward: the first target call below is the prefill
            result = engine.generate(ids, max_new_tokens, temperature=temperature, seed=seed + i,
                                     method=method, stop_on_eos=False, fuse_prefill=False,
                                     cache_prompt=False)
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


def wrap_backends(pair, args):
    """(target, draft) as given, or HFBackends with the --stock-* toggles (transformers only)."""
    if not isinstance(pair.target, torch.nn.Module):
        return pair.target, pair.draft
    from redwood.backends.hf import HFBackend

    options = dict(preallocate=not args.stock_cache, gqa_attention=not args.stock_attention)
    return HFBackend(pair.target, **options), HFBackend(pair.draft, **options)


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
    return Engine(*wrap_backends(pair, args), tree), prompts, pair.name


# --forwards variants: (preallocated cache, redwood_sdpa attention)
VARIANTS = {"stock": (False, False), "gqa": (False, True), "prealloc": (True, False), "both": (True, True)}


def forward_model(args):
    """(model, label): the shipped float32 target, or a mid-size random Qwen2 (12 query / 2 KV
    heads like the 1.5B target) if asked or if the shipped target cannot be loaded."""
    from redwood.errors import RedwoodError

    if not args.random_target:
        try:
            from redwood.models.hf_loading import load_model
            from redwood.models.shipped import shipped_model_dir

            directory = shipped_model_dir("target", "qwen2.5-coder", None, False, "quick")
            model = load_model(directory, dtype="float32", device="cpu", fast_linear=args.fast_linear)
            return model, "shipped target (float32" + (", fast linear)" if args.fast_linear else ")")
        except (RedwoodError, OSError) as err:
            print(f"shipped target not loadable ({err}); using a random Qwen2")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(args.seed)
    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=12, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).eval().requires_grad_(False), "random Qwen2 896x24"


def filled_backends(model, args):
    """{(context, variant): HFBackend} whose caches hold the same random K/V prefix
    ([1, kv_heads, context, head_dim] per layer; timing does not depend on the values)."""
    from redwood.backends.hf import HFBackend

    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    backends = {}
    for context in args.contexts:
        gen = torch.Generator().manual_seed(context)
        prefix = [(torch.randn(1, config.num_key_value_heads, context, head_dim, generator=gen),
                   torch.randn(1, config.num_key_value_heads, context, head_dim, generator=gen))
                  for _ in range(config.num_hidden_layers)]
        for name in args.variants:
            backend = HFBackend(model, preallocate=VARIANTS[name][0], gqa_attention=False)
            with torch.inference_mode():
                for layer, (keys, values) in zip(backend.cache.layers, prefix):
                    layer.update(keys.clone(), values.clone())
            backends[context, name] = backend
    return backends


def time_forward(model, backend, variant, tree, tokens, context):
    """Seconds of one run_tree over every node of `tree` (logits for all), and its logits;
    the tentative nodes are dropped afterwards so the cache stays at `context`."""
    from redwood.backends import hf_attention

    if VARIANTS[variant][1]:
        hf_attention.use_gqa_attention(model)
    else:
        hf_attention.use_stock_attention(model)
    with torch.inference_mode():
        start = time.perf_counter()
        logits = backend.run_tree(tree, range(len(tree)), tokens, context)
        seconds = time.perf_counter() - start
        backend.keep_path([])
    return seconds, logits


def forward_rows(model, args) -> list[dict]:
    """Interleaved repeats over (context, n, variant), after one untimed forward per backend."""
    import random

    backends = filled_backends(model, args)
    trees = {n: heap_tree(n) for n in args.nodes}
    tokens = {n: torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(n)) for n in args.nodes}
    times = {key: [] for key in ((c, n, v) for c in args.contexts for n in args.nodes for v in args.variants)}
    logits, order, largest = {}, random.Random(args.seed), max(args.nodes)
    for (context, variant), backend in backends.items():       # warm-up: buffers grown, kernels hot
        time_forward(model, backend, variant, trees[largest], tokens[largest], context)
    for _ in range(args.repeats):
        for context in args.contexts:
            for n in args.nodes:
                variants = list(args.variants)
                order.shuffle(variants)
                for variant in variants:
                    seconds, out = time_forward(model, backends[context, variant], variant,
                                                trees[n], tokens[n], context)
                    times[context, n, variant].append(1000.0 * seconds)
                    logits.setdefault((context, n, variant), out)
    rows = []
    for (context, n, variant), ms in times.items():
        reference = logits[context, n, args.variants[0]]
        rows.append({"context": context, "nodes": n, "variant": variant, "median_ms": sorted(ms)[len(ms) // 2],
                     "min_ms": min(ms), "all_ms": ms, "reference": args.variants[0],
                     "max_abs_logit_diff": float((logits[context, n, variant] - reference).abs().max())})
    return rows


def forward_table(rows) -> str:
    lines = [f"{'context':>8}{'n':>4}  {'variant':<10}{'median ms':>10}{'min ms':>9}{'vs ref':>8}{'max|diff|':>11}"]
    base = {(r["context"], r["nodes"]): r for r in rows if r["variant"] == r["reference"]}
    for r in rows:
        ref = base[r["context"], r["nodes"]]
        lines.append(f"{r['context']:>8}{r['nodes']:>4}  {r['variant']:<10}{r['median_ms']:>10.1f}"
                     f"{r['min_ms']:>9.1f}{100 * (r['median_ms'] / ref['median_ms'] - 1):>+7.1f}%"
                     f"{r['max_abs_logit_diff']:>11.1e}")
    return "\n".join(lines)


def forward_main(args, argv) -> dict:
    model, label = forward_model(args)
    variants = {k: {"preallocate": v[0], "gqa_attention": v[1]} for k, v in VARIANTS.items()}
    return run_ab("tree-forward-ab", label, lambda: forward_rows(model, args), forward_table,
                  args, argv, variants=variants)


def run_ab(kind: str, label: str, measure, table, args, argv, machine=None, **extra) -> dict:
    """Run an A/B measurement (measure() -> rows), print its header and table(rows), write the
    report JSON (write_report) and return it.
    extra: what the compared variants are, stored before the rows."""
    from redwood.bench.common import machine_name
    from redwood.measure.machine_profile import cpu_model

    load_start, started = Path("/proc/loadavg").read_text().strip(), time.perf_counter()
    rows = measure()
    report = {"format": 1, "kind": kind, "model": label, "machine": machine or machine_name(),
              "cpu": cpu_model(),
              "date": datetime.date.today().isoformat(), "threads": torch.get_num_threads(),
              "command": " ".join(["python benchmarks/engine_overhead.py", *(argv or sys.argv[1:])]),
              "repeats": args.repeats, "elapsed_seconds": time.perf_counter() - started,
              "loadavg": {"start": load_start, "end": Path("/proc/loadavg").read_text().strip()},
              **extra, "rows": rows}
    print(f"{label}, {report['threads']} threads, {args.repeats} interleaved repeats, "
          f"{report['elapsed_seconds']:.0f} s\nloadavg start {load_start} / end "
          f"{report['loadavg']['end']}")
    print(table(rows))
    return write_report(report, args.out)


def write_report(report: dict, out: str | None) -> dict:
    """Write a report's JSON to `out`, else results/<kind>-<machine>-<date>.json."""
    path = Path(out) if out else \
        RESULTS / f"{report['kind']}-{report['machine']}-{report['date']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
    return report


def heap_tree(n: int):
    """A binary heap of n nodes (node i's parent (i - 1) // 2): the A/B modes' trees."""
    from redwood.plan.tree import Tree

    return Tree([-1] + [(i - 1) // 2 for i in range(1, n)])


def _sibling(name: str):
    """A module of this directory (benchmarks/ is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    parser.add_argument("--stock-attention", action="store_true",
                        help="transformers' sdpa (repeat_kv copies K/V heads) instead of redwood_sdpa")
    parser.add_argument("--stock-cache", action="store_true",
                        help="torch.cat DynamicCache instead of the preallocated cache")
    parser.add_argument("--forwards", action="store_true",
                        help="A/B the target tree forward per variant instead of decoding")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS),
                        choices=list(VARIANTS))
    parser.add_argument("--prefill", action="store_true",
                        help="A/B the first verification: separate prefill vs prefill_tree")
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 150, 400],
                        help="--prefill prompt lengths (tokens)")
    parser.add_argument("--nodes", type=int, nargs="+", default=None,
                        help="tree sizes (default: 1 4 16 for --forwards, 4 16 for --prefill)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--random-target", action="store_true",
                        help="--forwards on a random Qwen2 (hidden 896, 24 layers), not the shipped target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny random pair (seconds)")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/"
                        "engine-overhead-<machine>-<date>.json)")
    args = parser.parse_args(argv)
    if args.prefill:
        return _sibling("prefill_ab").main(args, argv, forward_model, run_ab, heap_tree)
    args.nodes = args.nodes or [1, 4, 16]
    if args.forwards:
        return forward_main(args, argv)
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
    return write_report(report, args.out)


if __name__ == "__main__":
    main()
