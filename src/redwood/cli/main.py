"""`redwood` command line: a thin layer over the library API.

Each verb has an `_add_<verb>(subparsers)` that declares its arguments and a
`_cmd_<verb>(args)` that runs it. User errors raise RedwoodError (or ValueError
from validation) and are printed as one line with exit code 2.
"""
from __future__ import annotations

import argparse
import sys

from redwood.cli.options import _add_model_args, _model_config
from redwood.errors import RedwoodError
from redwood.serve.text_stream import STREAM_INTERVAL_S


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
    from redwood.plan import formats
    from redwood.plan import planner
    from redwood.plan import render

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

    from redwood.plan.tree import Tree

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

def _add_sampling_args(p, max_new_tokens=128):
    p.add_argument("--method", default="sequoia",
                   choices=["sequoia", "specinfer", "chain", "autoregressive"])
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument("--seed", type=int, default=None)


def _sampling_params(args):
    """The sampling options as SamplingParams, which checks them (before minutes of model
    loading); --method is checked by argparse."""
    from redwood.decode.params import SamplingParams

    return SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                          top_p=args.top_p, top_k=args.top_k, seed=args.seed)


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

    from redwood.cli.textgen import load_engine, stats_lines, stream_text

    params = _sampling_params(args)
    if not args.prompt.strip():         # encode_prompt says so too, but only after loading
        raise RedwoodError("the prompt is empty: give some text to continue")
    engine, tokenizer = load_engine(_model_config(args), temperature=params.temperature)
    on_text = None if args.json else (lambda piece: print(piece, end="", flush=True))
    result, text = stream_text(engine, tokenizer, args.prompt, params, chat=args.chat,
                               on_text=on_text, method=args.method,
                               stop_on_eos=not args.ignore_eos)
    if args.json:
        print(json.dumps({"text": text, **result.as_dict()}))
    else:
        print()
        for line in stats_lines(result):
            print(line, file=sys.stderr)
        if getattr(engine.drafter, "growth", None) is not None:
            print(f"trees grown per step inside {len(engine.tree)} nodes on this machine's costs "
                  "(--no-grow: the bundle's re-planned tree)", file=sys.stderr)


def _add_chat(sub):
    p = sub.add_parser("chat", help="a multi-turn conversation in the terminal",
                       description="Chat with the model: each turn streams its answer and a "
                       "speed line; the conversation's KV stays cached between turns (llama.cpp "
                       "backend), so a turn runs only its new tokens. An empty line or /exit ends.")
    _add_model_args(p)
    _add_sampling_args(p, max_new_tokens=512)
    p.add_argument("--system", default=None, help="a system message for the conversation")
    p.set_defaults(func=_cmd_chat)


def _cmd_chat(args):
    from redwood.cli.chat import run_chat

    return run_chat(_model_config(args), _sampling_params(args), args.system, args.method)


def _add_demo(sub):
    p = sub.add_parser("demo", help="redwood beside plain decoding on the same runtime",
                       description="Load the shipped pair (assembling or building its cache and "
                       "measuring this machine on first use), run one task greedily with redwood "
                       "and with the runtime's plain decoding (plain llama.cpp on the llama.cpp "
                       "backend), show both and the measured speedup.")
    p.add_argument("--task", default="edit", choices=["edit", "humaneval"],
                   help="edit: rename a function in a pasted module (prompt-lookup drafts); "
                   "humaneval: complete a HumanEval prompt (the tuned bundle)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="default: 256 for the edit task (a whole module comes back), 96 otherwise")
    p.add_argument("--problem", type=int, default=None,
                   help="which task of the set (default: edit task 3, whose renamed function is "
                   "the module's last, so most of the answer copies the input; HumanEval 0)")
    _add_model_args(p)
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args):
    from redwood.cli.demo import run_demo

    edit = args.task == "edit"
    tokens = args.max_new_tokens if args.max_new_tokens is not None else (256 if edit else 96)
    problem = args.problem if args.problem is not None else (3 if edit else 0)
    return run_demo(_model_config(args), tokens, problem, args.task)


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
    p.add_argument("--max-batch", type=int, default=None, metavar="N",
                   help="llama.cpp backend: serve up to N requests at once in one batch, with "
                   "trees planned for the batch (default: from this machine's profile, at most "
                   "16; with --drafter ngram 16, each request's prompt-lookup drafter sizing its "
                   "own trees); 1 = one request at a time (needed for --drafter hybrid). "
                   "The transformers backend serves one at a time")
    p.add_argument("--no-prompt-cache", action="store_true",
                   help="prefill every prompt in full (default: reuse the KV of the longest "
                   "cached prefix, as llama-server's cache_prompt: batched, finished requests' "
                   "cells stay cached and concurrent requests share a common prefix; one at a "
                   "time, the previous request's. A request may also send \"cache_prompt\": "
                   "false)")
    p.add_argument("--cache-tokens", type=int, default=None, metavar="N",
                   help="batched: besides the last finished request's cache (kept until its "
                   "next turn or another request), keep up to N KV cells of other finished "
                   "requests' prefixes (least recently used evicted first; default 0: on a CPU "
                   "every cached cell slows each live step, as attention spans the whole cache)")
    p.add_argument("--ngram-memory", type=int, default=32768, metavar="TOKENS",
                   help="--drafter ngram|hybrid|auto: the n-gram drafter also drafts from the "
                   "answers of earlier requests, kept up to TOKENS tokens (oldest answers "
                   "forgotten first; about 50 MB at the default; 0 = off). A request may send "
                   "\"ngram_memory\": false to neither use nor feed it")
    p.add_argument("--served-name", default=None,
                   help="model id shown in /v1/models and responses (default: the model's name)")
    p.add_argument("--stream-interval", type=float, default=STREAM_INTERVAL_S, metavar="SECONDS",
                   help="streamed answers: the first text goes out at once, later text at most "
                   f"every SECONDS (default {STREAM_INTERVAL_S}: each chunk wakes the server's "
                   "event loop, which costs a 2-core CPU ~1 %% of a step; 0 = every step)")
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args):
    import os
    from pathlib import Path

    from redwood.cli.textgen import default_drafter
    from redwood.measure.bundles import find_bundle, is_bundle_dir, shipped_bundle_dir
    from redwood.models.runtime import choose_backend
    from redwood.models.shipped import DEFAULT_PAIR

    _check_serve_args(args)
    pair = None if args.target else (args.model or DEFAULT_PAIR)
    # A tuned bundle (--tree auto or a bundle dir) gives each request the tree tuned for the
    # temperature nearest its own.
    backend = choose_backend(args.backend, args.target, args.draft, args.device)
    if args.tree is None and pair is not None \
            and is_bundle_dir(shipped_bundle_dir(pair, backend=backend)):
        args.tree = "auto"                          # the shipped pair: its tuned bundle
    bundle = find_bundle(args.tree, pair, backend) if args.tree else None
    if args.tree and bundle is None and not Path(args.tree).is_file():
        raise RedwoodError(f"tree {args.tree} does not exist; give a tree JSON (`redwood plan`), "
                           "a bundle directory (`redwood tune`) or 'auto'")
    from redwood.serve.app import ServerConfig, create_app, run_server
    from redwood.cli.textgen import bundle_drafting

    config = ServerConfig(
        model_name=args.served_name or args.model or (Path(args.target).name if args.target
                                                      else DEFAULT_PAIR),
        method=args.method, max_queue=args.max_queue, default_max_tokens=args.max_tokens,
        api_key=args.api_key or os.environ.get("REDWOOD_API_KEY") or None,
        host=args.host, port=args.port,
        drafting_for_temperature=None, stream_interval=args.stream_interval)
    model_config = _model_config(args)
    args.drafter = default_drafter(args.drafter, backend, bool(args.tree) and bundle is None)
    engine, tokenizer, bundle = _load_serve_engine(args, backend, bundle, model_config)
    if bundle is not None:
        config.drafting_for_temperature = bundle_drafting(bundle, engine, model_config)
    if args.host not in ("127.0.0.1", "localhost", "::1") and config.api_key is None:
        print(f"warning: serving on {args.host} without --api-key: anyone who can reach this "
              "port can use the model", file=sys.stderr)
    batched = getattr(engine, "batched", False)
    trees = (f"bundle {bundle.directory}" if bundle else
             "n-gram trees sized per step" if batched and engine.ngram is not None else
             "trees planned per batch" if batched else f"tree of {len(engine.tree)} nodes")
    print(f"redwood serve: {config.model_name} ({args.method}, {trees}, {backend} backend) "
          f"on http://{args.host}:{args.port}/v1", file=sys.stderr)
    run_server(create_app(engine, tokenizer, config), config)


def _check_serve_args(args):
    """The `serve` options that are wrong whatever the machine: refused before any model loads."""
    if args.model is not None and (args.target or args.draft):
        raise RedwoodError("give either --model or --target/--draft, not both")
    if not 0 <= args.port < 65536:
        raise RedwoodError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    if args.max_batch is not None and args.max_batch < 1:
        raise RedwoodError(f"--max-batch must be at least 1, got {args.max_batch}")
    if args.cache_tokens is not None and args.cache_tokens < 0:
        raise RedwoodError(f"--cache-tokens must be at least 0, got {args.cache_tokens}")
    if args.ngram_memory < 0:
        raise RedwoodError(f"--ngram-memory must be at least 0, got {args.ngram_memory}")


def _load_serve_engine(args, backend, bundle, model_config):
    """The engine `serve` runs: the continuous-batching scheduler on llama.cpp (draft model or
    prompt lookup), else one request at a time. Returns (engine, tokenizer, bundle); the bundle
    is dropped where drafters size their own trees."""
    from redwood.cli.textgen import attach_ngram_memory, load_engine

    batched_drafters = ("model", "ngram", "auto")
    if args.drafter not in batched_drafters and backend == "llamacpp" \
            and args.max_batch not in (None, 1):
        raise RedwoodError("continuous batching drafts with the draft model or by prompt lookup "
                           f"(ngram, or auto: one of them for this machine); use --max-batch 1 "
                           f"with --drafter {args.drafter} (one request at a time)")
    if backend == "llamacpp" and args.max_batch != 1 and args.drafter in batched_drafters:
        from redwood.serve.batch_setup import load_batch_scheduler

        engine, tokenizer = load_batch_scheduler(args.model, args.target, args.draft, args.tree,
                                                 args.max_batch, args.method,
                                                 prefix_cache=not args.no_prompt_cache,
                                                 cache_tokens=args.cache_tokens,
                                                 drafter=args.drafter,
                                                 ngram_memory=args.ngram_memory)
        bundle = None
        drafts = "prompt lookup" if engine.ngram is not None else \
            "the draft model where it pays" if engine.draft is not None else "none"
        print(f"redwood serve: continuous batching of up to {engine.max_batch} requests "
              f"(drafts: {drafts})", file=sys.stderr)
    else:
        engine, tokenizer = load_engine(model_config)
        engine.prompt_cache = not args.no_prompt_cache
        attach_ngram_memory(engine, args.ngram_memory)
        if args.drafter != "model":
            bundle = None                       # n-gram / hybrid drafters size their own trees
    return engine, tokenizer, bundle


# -------------------------------------------------------------------------------------

def _verbs():
    from redwood.cli.bench import _add_bench
    from redwood.cli.measure import _add_calibrate, _add_profile, _add_tune

    return [_add_plan, _add_export, _add_generate, _add_chat, _add_demo, _add_serve, _add_profile,
            _add_calibrate, _add_tune, _add_bench]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="redwood", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    for add in _verbs():
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
