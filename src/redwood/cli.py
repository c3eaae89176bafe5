"""`redwood` command line: a thin layer over the library API.

Each verb has an `_add_<verb>(subparsers)` that declares its arguments and a
`_cmd_<verb>(args)` that runs it. User errors raise RedwoodError (or ValueError
from validation) and are printed as one line with exit code 2.
"""
from __future__ import annotations

import argparse
import sys

from redwood.errors import RedwoodError


# --- plan / export (planner issue) -------------------------------------------------

def _add_plan(sub):
    p = sub.add_parser("plan", help="plan a DP-optimal draft tree",
                       description="Plan the Sequoia DP-optimal draft tree for an acceptance "
                       "vector; with a latency profile, also choose its size for this hardware.")
    p.add_argument("--acceptance", required=True, metavar="A.json",
                   help="acceptance vector JSON ('sample' = the shipped sample)")
    p.add_argument("--budget", required=True, type=int, metavar="N",
                   help="tree nodes incl. the root (with --profile: the largest budget to consider)")
    p.add_argument("--max-depth", required=True, type=int, metavar="D",
                   help="most levels, the root being level 1")
    p.add_argument("--profile", metavar="P.json",
                   help="latency profile JSON ('sample' = the shipped sample): choose (n, d) "
                   "for the most tokens per second over the measured budgets")
    p.add_argument("--out", metavar="tree.json", help="write the tree JSON here")
    p.add_argument("--plot", metavar="F.png", help="write a picture of the tree and the plan")
    p.set_defaults(func=_cmd_plan)


def _cmd_plan(args):
    from redwood import formats, planner, render

    def resolve(path, sample):
        return sample() if path == "sample" else path

    acceptance = formats.Acceptance.load(resolve(args.acceptance, formats.sample_acceptance_path))
    p, choice = acceptance.p, None
    if args.profile:
        profile = formats.Profile.load(resolve(args.profile, formats.sample_profile_path))
        choice = planner.choose_tree(acceptance, profile, args.budget, args.max_depth)
        tree, table = choice.tree, choice.table
    else:
        table = planner.dp_table(acceptance, args.budget, args.max_depth)
        tree = table.tree(table.budget, table.max_depth)
    tree.source.update({"acceptance": str(args.acceptance), "profile": args.profile})
    print(tree.render(p))
    print(render.describe_tree(tree, p))
    if choice is not None:
        print()
        print(render.format_candidates(choice))
    try:
        if args.out:
            tree.save(args.out, p)
            print(f"wrote {args.out}")
        if args.plot:
            render.save_plan_figure(args.plot, tree, table, p=p, choice=choice)
            print(f"wrote {args.plot}")
    except OSError as exc:
        raise RedwoodError(f"cannot write {exc.filename}: {exc.strerror}") from None
    return 0


def _add_export(sub):
    p = sub.add_parser("export", help="export a tree for other serving engines",
                       description="Print a tree JSON as a vLLM speculative_token_tree "
                       "(list of tuples of 0-based ranks), Medusa choices, or tree JSON.")
    p.add_argument("tree", metavar="tree.json", help="tree JSON written by `redwood plan`")
    p.add_argument("--format", choices=["vllm", "medusa", "json"], default="vllm")
    p.add_argument("--max-depth", type=int, metavar="D",
                   help="reject trees with more levels than this (root = level 1)")
    p.add_argument("--out", metavar="FILE", help="write here instead of printing")
    p.set_defaults(func=_cmd_export)


def _cmd_export(args):
    import json

    from redwood.tree import Tree

    tree = Tree.load(args.tree, max_depth=args.max_depth)
    if args.format == "vllm":
        text = str(tree.to_vllm())
    elif args.format == "medusa":
        text = json.dumps(tree.to_medusa())
    else:
        text = json.dumps(tree.to_dict(), indent=1)
    if not args.out:
        print(text)
        return 0
    try:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    except OSError as exc:
        raise RedwoodError(f"cannot write {exc.filename}: {exc.strerror}") from None
    return 0


# --- generate / demo (engine issue) --------------------------------------------------

def _add_model_args(p):
    p.add_argument("--model", default=None, help="shipped model pair (default: qwen2.5-coder)")
    p.add_argument("--target", default=None, help="target model: HF directory or .gguf file")
    p.add_argument("--draft", default=None, help="draft model: HF directory or .gguf file")
    p.add_argument("--tree", default=None,
                   help="tree JSON from `redwood plan` (default: the tree shipped with redwood)")
    p.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16, float16")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--draft-quantize", default=None, choices=["int8"],
                   help="dynamic int8 draft on CPU: faster drafts, output stays exact")
    p.add_argument("--fast-linear", action="store_true",
                   help="CPU float32: oneDNN matmuls for 4-64 rows (up to 2x faster tree forwards)")


def _add_sampling_args(p, max_new_tokens=128):
    p.add_argument("--method", default="sequoia",
                   choices=["sequoia", "specinfer", "chain", "autoregressive"])
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument("--seed", type=int, default=None)


def _model_config(args):
    from redwood.textgen import ModelConfig

    return ModelConfig(model=args.model, target=args.target, draft=args.draft, tree=args.tree,
                       dtype=args.dtype, device=args.device, draft_quantize=args.draft_quantize,
                       fast_linear=getattr(args, "fast_linear", False))


def _sampling_config(args):
    from redwood.textgen import SamplingConfig

    config = SamplingConfig(method=args.method, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, max_new_tokens=args.max_new_tokens, seed=args.seed,
                            stop_on_eos=not getattr(args, "ignore_eos", False))
    config.check()
    return config


def _add_generate(sub):
    p = sub.add_parser("generate", help="generate text with tree speculative decoding",
                       description="Stream a completion of PROMPT, then print speed and acceptance.")
    p.add_argument("prompt", help="the text to continue (or the user message with --chat)")
    _add_model_args(p)
    _add_sampling_args(p)
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    p.add_argument("--ignore-eos", action="store_true", help="always generate max-new-tokens")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead")
    p.set_defaults(func=_cmd_generate)


def _cmd_generate(args):
    import json

    from redwood.prompts import encode_prompt
    from redwood.textgen import load_engine, stats_lines, stream_text

    sampling = _sampling_config(args)
    if not args.prompt.strip():
        raise RedwoodError("the prompt is empty: give some text to continue")
    engine, tokenizer = load_engine(_model_config(args), temperature=args.temperature)
    encode_prompt(tokenizer, args.prompt, args.chat)          # fail on a bad prompt before streaming
    on_text = None if args.json else (lambda piece: print(piece, end="", flush=True))
    result, text = stream_text(engine, tokenizer, args.prompt, sampling, args.chat, on_text)
    if args.json:
        print(json.dumps({"text": text, **result.as_dict()}))
    else:
        print()
        for line in stats_lines(result):
            print(line, file=sys.stderr)


def _add_demo(sub):
    p = sub.add_parser("demo", help="complete a HumanEval prompt with sequoia and autoregressive",
                       description="Load the shipped pair (building its cache on first use), "
                       "complete one HumanEval prompt greedily with sequoia and with the target "
                       "alone, show both and the measured speedup.")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--problem", type=int, default=0, help="index into the evaluation split")
    _add_model_args(p)
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args):
    from redwood.demo import run_demo

    return run_demo(_model_config(args), args.max_new_tokens, args.problem)


# --- serve (server issue) ------------------------------------------------------------

def _add_serve(sub):
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server",
                       description="Serve /v1/completions, /v1/chat/completions, /v1/models, "
                       "/health and /metrics (Prometheus) with tree speculative decoding.")
    _add_model_args(p)
    p.add_argument("--method", default="sequoia",
                   choices=["sequoia", "specinfer", "chain", "autoregressive"])
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="default 8000; 0 picks a free port")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (default: $REDWOOD_API_KEY if set)")
    p.add_argument("--max-queue", type=int, default=16,
                   help="requests that may wait for the engine; more get HTTP 429 (default 16)")
    p.add_argument("--max-tokens", type=int, default=256,
                   help="max_tokens for requests that give none (default 256)")
    p.add_argument("--served-name", default=None,
                   help="model id shown in /v1/models and responses (default: the model's name)")
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args):
    import functools
    import os
    from pathlib import Path

    from redwood.presets import find_bundle
    from redwood.shipped import DEFAULT_PAIR

    if args.model is not None and (args.target or args.draft):
        raise RedwoodError("give either --model or --target/--draft, not both")
    if not 0 <= args.port < 65536:
        raise RedwoodError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    pair = None if args.target else (args.model or DEFAULT_PAIR)
    # A tuned bundle (--tree auto or a bundle dir) gives each request the tree tuned for the
    # temperature nearest its own.
    bundle = find_bundle(args.tree, pair) if args.tree else None
    if args.tree and bundle is None and not Path(args.tree).is_file():
        raise RedwoodError(f"tree {args.tree} does not exist; give a tree JSON (`redwood plan`), "
                           "a bundle directory (`redwood tune`) or 'auto'")
    from redwood.server import ServerConfig, create_app, run_server
    from redwood.textgen import load_engine

    config = ServerConfig(
        model_name=args.served_name or args.model or (Path(args.target).name if args.target
                                                      else DEFAULT_PAIR),
        method=args.method, max_queue=args.max_queue, default_max_tokens=args.max_tokens,
        api_key=args.api_key or os.environ.get("REDWOOD_API_KEY") or None,
        host=args.host, port=args.port,
        tree_for_temperature=functools.lru_cache(maxsize=None)(bundle.tree) if bundle else None)
    engine, tokenizer = load_engine(_model_config(args))
    if args.host not in ("127.0.0.1", "localhost", "::1") and config.api_key is None:
        print(f"warning: serving on {args.host} without --api-key: anyone who can reach this "
              "port can use the model", file=sys.stderr)
    trees = f"bundle {bundle.directory}" if bundle else f"tree of {len(engine.tree)} nodes"
    print(f"redwood serve: {config.model_name} ({args.method}, {trees}) "
          f"on http://{args.host}:{args.port}/v1", file=sys.stderr)
    run_server(create_app(engine, tokenizer, config), config)


# --- profile / calibrate / tune (tuning issue) -----------------------------------------

def _add_quick(p):
    p.add_argument("--quick", action="store_true",
                   help="tiny random models built in-process instead of real ones: runs in "
                   "seconds (for CI and trying the pipeline)")


def _no_tree(args):
    if args.tree is not None:
        raise RedwoodError(f"--tree does not apply to `redwood {args.verb}` (it measures the "
                           "models; `redwood tune` makes trees)")


def _writable_file(path, flag):
    """Fail before loading models if an output file cannot be created."""
    from pathlib import Path

    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise RedwoodError(f"{flag} {path}: directory {parent} does not exist")
    if Path(path).is_dir():
        raise RedwoodError(f"{flag} {path} is a directory; give a file name")


def _save(write, path, flag):
    try:
        write(path)
    except OSError as exc:
        raise RedwoodError(f"cannot write {flag} {path}: {exc.strerror}") from None
    print(f"wrote {path}")


def _add_profile(sub):
    p = sub.add_parser("profile", help="measure forward latency for the planner",
                       description="Time one target forward over a tree of n tokens for every "
                       "n the planner may choose (1..32, then 48, 64, 96, 128 up to "
                       "--max-budget) and one draft forward per level width, over a cache of "
                       "--context tokens; medians. Writes a profile JSON for `redwood plan`.")
    _add_model_args(p)
    p.add_argument("--context", type=int, default=256, help="cached tokens (default 256)")
    p.add_argument("--max-budget", type=int, default=128, help="largest tree size (default 128)")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    p.add_argument("--out", required=True, metavar="P.json", help="write the profile here")
    p.add_argument("--plot", metavar="F.png", help="also draw t(n) for both models")
    _add_quick(p)
    p.set_defaults(func=_cmd_profile)


def _cmd_profile(args):
    from redwood.profile import default_sizes, profile_latency
    from redwood.tune import load_models

    _no_tree(args)
    sizes = default_sizes(args.max_budget)
    _writable_file(args.out, "--out")
    if args.plot:
        _writable_file(args.plot, "--plot")
    pair = load_models(_model_config(args), quick=args.quick)
    profile = profile_latency(pair.target, pair.draft, context=args.context, budgets=sizes,
                              repeats=args.repeats, warmup=args.warmup)
    profile.extra["source"].update({"target": pair.labels["target"], "draft": pair.labels["draft"],
                                    "draft_quantize": pair.draft_quantize})
    print(f"{profile.device}; target {profile.dtype}, draft {profile.extra['draft_dtype']}; "
          f"context {profile.context}")
    print("    n  target ms  draft ms")
    for n in sizes:
        print(f"{n:>5} {profile.target_ms[n]:>10.1f} {profile.draft_ms[n]:>9.1f}")
    _save(profile.save, args.out, "--out")
    if args.plot:
        from redwood.tuneplots import save_profile_figure

        _save(lambda path: save_profile_figure(path, profile, title=profile.device),
              args.plot, "--plot")
    return 0


def _add_calibration_args(p, num_prompts):
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--method", default="sequoia", choices=["sequoia", "specinfer"],
                   help="how the star's children are drawn: without (sequoia) or with "
                   "(specinfer) replacement")
    p.add_argument("--width", type=int, default=None,
                   help="children of the star = length of p (default 16; --quick 8)")
    p.add_argument("--prompts", default="humaneval", metavar="humaneval|FILE.jsonl",
                   help="the HumanEval calibration split (default) or a JSONL file of "
                   '{"prompt": ...} lines')
    p.add_argument("--num-prompts", type=int, default=None,
                   help=f"use the first N prompts (default {num_prompts})")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens generated per prompt (default 64; --quick 24)")
    p.add_argument("--seed", type=int, default=0)


def _given(value, default):
    return default if value is None else value


def _prompt_source_check(args):
    """A malformed prompt file fails before minutes of model loading."""
    if args.prompts != "humaneval":
        from redwood.prompts import read_prompt_file

        read_prompt_file(args.prompts)
    if args.num_prompts is not None and args.num_prompts < 1:
        raise RedwoodError(f"--num-prompts must be >= 1, got {args.num_prompts}")


def _add_calibrate(sub):
    p = sub.add_parser("calibrate", help="measure the acceptance vector on-policy",
                       description="Decode the calibration prompts proposing a star of --width "
                       "children per step under the method's sampling rule, verify it with the "
                       "real verification, and count which rank was accepted. Writes an "
                       "acceptance JSON (p, the counts behind it, the steps).")
    _add_model_args(p)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    _add_calibration_args(p, num_prompts=16)
    p.add_argument("--out", required=True, metavar="A.json", help="write the vector here")
    p.add_argument("--plot", metavar="F.png", help="also draw the vector")
    _add_quick(p)
    p.set_defaults(func=_cmd_calibrate)


def _cmd_calibrate(args):
    from redwood.calibrate import calibrate
    from redwood.engine import check_sampling
    from redwood.tune import QUICK_SETTINGS, load_models, prompts_for

    _no_tree(args)
    width = _given(args.width, QUICK_SETTINGS["width"] if args.quick else 16)
    max_new = _given(args.max_new_tokens, QUICK_SETTINGS["max_new_tokens"] if args.quick else 64)
    if isinstance(width, bool) or width < 1:
        raise RedwoodError(f"--width must be >= 1, got {width}")
    check_sampling(max_new, args.temperature, args.top_p, args.top_k)
    _prompt_source_check(args)
    _writable_file(args.out, "--out")
    if args.plot:
        _writable_file(args.plot, "--plot")
    pair = load_models(_model_config(args), quick=args.quick)
    prompts, dataset = prompts_for(pair, args.prompts, args.num_prompts or (None if args.quick else 16),
                                   quick=args.quick)
    acceptance = calibrate(pair.target, pair.draft, prompts, args.temperature, top_p=args.top_p,
                           top_k=args.top_k, method=args.method, width=width,
                           max_new_tokens=max_new, seed=args.seed, dataset=dataset,
                           target_name=pair.labels["target"], draft_name=pair.labels["draft"])
    acceptance.extra["draft_quantize"] = pair.draft_quantize
    print(f"{acceptance.steps} steps, {acceptance.extra['tokens']} tokens, "
          f"{acceptance.extra['seconds']:.1f} s; T = {args.temperature:g}, method {args.method}")
    print("p = [" + ", ".join(f"{x:.4f}" for x in acceptance.p) + "]")
    print(f"sum(p) = {acceptance.p.sum():.4f} (a draft token accepted); "
          f"no child accepted in {acceptance.extra['rejected']} steps")
    _save(acceptance.save, args.out, "--out")
    if args.plot:
        from redwood.tuneplots import save_acceptance_figure

        _save(lambda path: save_acceptance_figure(path, {f"T = {args.temperature:g}": acceptance}),
              args.plot, "--plot")
    return 0


def _add_tune(sub):
    p = sub.add_parser("tune", help="profile + calibrate + plan: a tuned bundle for --tree auto",
                       description="Profile this machine, calibrate the acceptance vector at "
                       "each temperature, choose the fastest tree for each, and write a bundle "
                       "directory (profile, vectors, trees, summary.md, plots) that "
                       "`generate --tree DIR` or `--tree auto` (with REDWOOD_BUNDLE=DIR) uses.")
    _add_model_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="bundle directory to write")
    p.add_argument("--temperatures", default="0,0.6,1.0", help="comma-separated (default 0,0.6,1.0)")
    _add_calibration_args(p, num_prompts=8)
    p.add_argument("--max-budget", type=int, default=None,
                   help="largest tree (nodes incl. root) to profile and plan (default 32)")
    p.add_argument("--max-depth", type=int, default=None, help="most levels (default 16)")
    p.add_argument("--context", type=int, default=None, help="profile cache length (default 256)")
    p.add_argument("--repeats", type=int, default=None, help="profile rounds (default 5)")
    p.add_argument("--warmup", type=int, default=None, help="untimed profile rounds (default 2)")
    p.add_argument("--compare-int8-draft", action="store_true",
                   help="also tune an int8 copy of the draft; the bundle keeps the variant the "
                   "planner predicts faster")
    _add_quick(p)
    p.set_defaults(func=_cmd_tune)


def _tune_settings(args):
    from redwood.tune import QUICK_SETTINGS, TuneSettings

    try:
        temperatures = tuple(float(t) for t in args.temperatures.split(","))
    except ValueError:
        raise RedwoodError(f"--temperatures must be comma-separated numbers, got "
                           f"{args.temperatures!r}") from None
    base = TuneSettings(**QUICK_SETTINGS) if args.quick else TuneSettings()
    given = {name: getattr(args, name) for name in ("width", "max_budget", "max_depth", "context",
                                                    "repeats", "warmup", "max_new_tokens")
             if getattr(args, name) is not None}
    settings = TuneSettings(**{**vars(base), **given, "temperatures": temperatures,
                               "top_p": args.top_p, "top_k": args.top_k, "method": args.method,
                               "seed": args.seed})
    settings.check()
    return settings


def _command_line(args) -> str:
    """The command as run, rebuilt from the parsed arguments (defaults left out)."""
    import shlex

    parts = ["redwood", args.verb]
    for key, value in vars(args).items():
        if key in ("func", "verb") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        parts += [flag] if value is True else [flag, shlex.quote(str(value))]
    return " ".join(parts)


def _cmd_tune(args):
    from pathlib import Path

    _no_tree(args)
    from redwood.tune import check_out_dir, int8_copy, load_models, prompts_for, tune

    settings = _tune_settings(args)
    _prompt_source_check(args)
    if args.compare_int8_draft and args.draft_quantize:
        raise RedwoodError("--compare-int8-draft tunes the float draft and an int8 copy; "
                           "drop --draft-quantize")
    check_out_dir(Path(args.out))
    pair = load_models(_model_config(args), quick=args.quick)
    prompts, dataset = prompts_for(pair, args.prompts, args.num_prompts or (None if args.quick else 8),
                                   quick=args.quick)
    others = {"int8": int8_copy(pair.draft)} if args.compare_int8_draft else None
    result = tune(pair.target, pair.draft, args.out, prompts, settings,
                  draft_quantize=pair.draft_quantize, other_drafts=others, labels=pair.labels,
                  dataset=dataset, command=_command_line(args))
    chosen = result.chosen
    if len(result.variants) > 1:
        for v in result.variants:
            print(f"draft {v.name}: mean predicted speedup {v.mean_speedup:.3f}x"
                  + ("  (chosen)" if v is chosen else ""))
    for temperature, c in chosen.choices.items():
        print(f"T = {temperature:g}: n = {c.budget}, d = {c.depth}, levels {c.tree.level_sizes}, "
              f"{c.tokens_per_step:.3f} tokens/step, predicted speedup {c.speedup:.3f}x")
    print(f"wrote {result.directory} in {result.seconds:.0f} s "
          f"(use: redwood generate --tree {result.directory} ...)")
    return 0


# --- bench (tuning issue: benchmarks) ------------------------------------------------

def _add_bench(sub):
    p = sub.add_parser("bench", help="benchmark redwood against transformers baselines",
                       description="Run autoregressive, transformers generate and assisted "
                       "generation, chain, specinfer and sequoia on the HumanEval evaluation "
                       "split (EOS ignored, prefill excluded, methods interleaved per prompt); "
                       "write a summary JSON, raw per-prompt JSON, a markdown table and plots "
                       "under --out-dir. --scaling measures tokens per step against tree size.")
    _add_model_args(p)
    p.add_argument("--quick", action="store_true",
                   help="tiny random models built in-process: the whole pipeline in seconds")
    p.add_argument("--scaling", action="store_true",
                   help="tokens per target forward vs tree budget 1, 2, 4, ... --max-budget")
    p.add_argument("--prompts", type=int, default=None, help="evaluation prompts (default 20)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 128")
    p.add_argument("--temperatures", type=float, nargs="+", default=None,
                   help="default 0 0.6 1.0")
    p.add_argument("--top-p", type=float, nargs="+", default=None, dest="top_ps",
                   help="default 1.0 0.9")
    p.add_argument("--methods", nargs="+", default=None,
                   help="subset of autoregressive hf_generate hf_assisted_default "
                   "hf_assisted_constant chain specinfer sequoia (default: all)")
    p.add_argument("--hf-constant-grid", type=int, nargs="+", default=None, metavar="K",
                   help="constant num_assistant_tokens to try (default 2 3 4 6 8)")
    p.add_argument("--specinfer-grid", default=None, metavar="KxD,...",
                   help="specinfer trees to try (default 2x1,2x2,2x3,3x1,3x2,4x2)")
    p.add_argument("--select-prompts", type=int, default=None,
                   help="calibration-split prompts that pick the grid entries (default 1; "
                   "0 = the planner's objective)")
    p.add_argument("--select-tokens", type=int, default=None, help="tokens per selection run")
    p.add_argument("--acceptance", nargs="+", default=[], metavar="A.json",
                   help="acceptance vectors (default: the tuned bundle's)")
    p.add_argument("--profile", default=None, metavar="P.json",
                   help="latency profile for planning (default: the tuned bundle's)")
    p.add_argument("--max-budget", type=int, default=None,
                   help="largest tree when planning, and the --scaling range (default 32)")
    p.add_argument("--max-depth", type=int, default=None, help="most tree levels (default 12)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="benchmarks/results")
    p.add_argument("--machine", default=None, help="name in the output files (default cpu-<N>core)")
    p.add_argument("--no-plots", action="store_true")
    p.set_defaults(func=_cmd_bench)


def _bench_command(args) -> str:
    """The command line that reproduces this run (every option that was set)."""
    import shlex

    parts = ["redwood", "bench"]
    for key, value in vars(args).items():
        if key in ("func", "verb") or value is None or value is False or value == []:
            continue
        parts.append("--" + {"top_ps": "top_p"}.get(key, key).replace("_", "-"))
        if value is not True:
            parts += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return shlex.join(parts)


def _cmd_bench(args):
    from redwood.bench import config_from_options, run_command

    options = {key: getattr(args, key) for key in (
        "prompts", "max_new_tokens", "temperatures", "top_ps", "methods", "hf_constant_grid",
        "specinfer_grid", "select_prompts", "select_tokens", "max_budget", "max_depth", "seed",
        "out_dir", "machine")}
    config = config_from_options(args.quick, plots=not args.no_plots,
                                 command=_bench_command(args), **options)
    return run_command(config, _model_config(args), args.acceptance, args.profile, args.scaling)


# -------------------------------------------------------------------------------------

_VERBS = [_add_plan, _add_export, _add_generate, _add_demo, _add_serve, _add_bench,
          _add_profile, _add_calibrate, _add_tune]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="redwood", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    for add in _VERBS:
        add(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (RedwoodError, ValueError, FileNotFoundError) as exc:
        print(f"redwood {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
