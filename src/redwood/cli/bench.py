"""`redwood bench`: the benchmarking verb of the CLI (in-process methods against the
transformers or llama-cpp-python baselines, or `--servers`: servers through one HTTP client).

Same conventions as cli/main.py: `_add_<verb>` declares arguments, `_cmd_<verb>` runs the
library function; user errors raise RedwoodError.
"""
from __future__ import annotations

from redwood.bench.server_specs import METHODS
from redwood.cli.options import _add_model_args, _add_quick, _model_config
from redwood.errors import RedwoodError


def _add_bench(sub):
    p = sub.add_parser("bench", help="benchmark redwood against transformers or llama.cpp "
                       "baselines",
                       description="Run autoregressive, transformers generate and assisted "
                       "generation, chain, specinfer and sequoia on the HumanEval evaluation "
                       "split (EOS ignored, prefill excluded, methods interleaved per prompt); "
                       "with --backend llamacpp (the default for the shipped pair on a CPU "
                       "with llama-cpp-python installed) the baselines are llama-cpp-python's "
                       "plain Llama generation and its prompt lookup, and the primary figure "
                       "is the end-to-end time per request, prefill included. Writes a summary "
                       "JSON, raw per-prompt JSON, a markdown table and plots under --out-dir. "
                       "--scaling measures tokens per step against tree size.")
    _add_model_args(p)
    _add_quick(p)
    p.add_argument("--scaling", action="store_true",
                   help="tokens per target forward vs tree budget 1, 2, 4, ... --max-budget")
    p.add_argument("--prompts", type=int, default=None,
                   help="prompts per prompt set (default 20)")
    p.add_argument("--prompt-set", nargs="+", default=None, dest="prompt_sets",
                   metavar="SET",
                   help="prompt sets, one table each: humaneval (raw completion, the default) "
                   "and the input-grounded chat edit tasks whole_file, mixed, low_copy")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 128")
    p.add_argument("--temperatures", type=float, nargs="+", default=None,
                   help="default 0 0.6 1.0")
    p.add_argument("--top-p", type=float, nargs="+", default=None, dest="top_ps",
                   help="default 1.0 0.9")
    p.add_argument("--methods", nargs="+", default=None,
                   help="transformers backend: subset of autoregressive hf_generate "
                   "hf_assisted_default hf_assisted_constant chain specinfer sequoia "
                   "sequoia_adaptive (+ sequoia_fixed sequoia_governed sequoia_grown ngram "
                   "hybrid); llama.cpp backend: of llamacpp_plain autoregressive chain specinfer "
                   "sequoia sequoia_fixed sequoia_governed sequoia_grown ngram hybrid "
                   "llamacpp_prompt_lookup llamacpp_prompt_lookup_best (+ sequoia_adaptive) "
                   "(default: all but the bracketed)")
    p.add_argument("--lookup-grid", type=int, nargs="+", default=None, metavar="K",
                   help="num_pred_tokens tried for llamacpp_prompt_lookup_best on each prompt "
                   "set's first prompt (default 2 4 10)")
    p.add_argument("--fixed-tree", default=None, metavar="TREE.json",
                   help="the untuned tree of sequoia_fixed (default: the shipped default tree)")
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
    p.add_argument("--servers", nargs="+", default=None, metavar="METHOD",
                   help="benchmark servers through one HTTP client instead: "
                   + ", ".join(METHODS) + " (llama-server, plain, is always included as the "
                   "baseline; llama-server-again is a second plain one, the A/A control). "
                   "Natural stop; defaults: --prompt-set chat humaneval whole_file, --prompts "
                   "10, --max-new-tokens 512 (max_tokens), --temperatures 0")
    p.add_argument("--rounds", type=int, default=3, help="--servers: rounds (default 3)")
    p.add_argument("--llama-server", default=None, metavar="PATH",
                   help="--servers: the llama-server binary (default: $REDWOOD_LLAMA_SERVER, "
                   "else what `make llama-server` built in .venv/llama-server)")
    p.add_argument("--stream", action="store_true",
                   help="--servers: stream the answers (also records time to first token)")
    p.add_argument("--cache-prompt", action="store_true",
                   help="--servers: keep every server's prompt cache (a request reuses the "
                   "prefix it shares with that server's previous one, as agent loops do); "
                   "default: every request evaluates its whole prompt")
    p.add_argument("--fresh-rounds", action="store_true",
                   help="--servers: start every server afresh before each round (and each "
                   "temperature in it), so no request sees what a server learnt from another "
                   "(redwood's memory of earlier answers, ngram-mod's pool, prompt caches): the "
                   "per-prompt minimum over rounds is then each prompt's best first sight")
    p.set_defaults(func=_cmd_bench)


def _bench_command(args) -> str:
    """The command line that reproduces this run (every option that was set)."""
    import shlex

    parts = ["redwood", "bench"]
    for key, value in vars(args).items():
        if key in ("func", "verb") or value is None or value is False or value == []:
            continue
        parts.append("--" + {"top_ps": "top_p", "prompt_sets": "prompt_set"}.get(key, key)
                     .replace("_", "-"))
        if value is not True:
            parts += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return shlex.join(parts)


def _bench_backend(args) -> str:
    """'hf' or 'llamacpp' for a bench: --quick runs the tiny transformers pair; otherwise
    --backend as every verb reads it (models.runtime.choose_backend)."""
    from redwood.models.runtime import choose_backend

    if args.quick:
        if args.backend == "llamacpp":
            raise RedwoodError("--quick runs the tiny transformers pair; for a llama.cpp pipeline "
                               "check pass small GGUF files with --target/--draft")
        return "hf"
    return choose_backend(args.backend, args.target, args.draft, args.device)


def _cmd_bench_servers(args):
    from redwood.bench.server_bench import ServerBenchConfig
    from redwood.bench.server_run import run_servers_command

    config = ServerBenchConfig(
        methods=list(args.servers), prompt_sets=tuple(args.prompt_sets or
                                                      ("chat", "humaneval", "whole_file")),
        prompts=args.prompts or 10, rounds=args.rounds,
        temperatures=tuple(args.temperatures or (0.0,)),
        max_tokens=args.max_new_tokens or 512, seed=args.seed, stream=args.stream,
        cache_prompt=args.cache_prompt, fresh_rounds=args.fresh_rounds, out_dir=args.out_dir,
        machine=args.machine)
    paths = run_servers_command(config, args.llama_server, args.target, args.draft,
                                _bench_command(args))
    print("wrote " + ", ".join(paths.values()))
    return 0


def _cmd_bench(args):
    from redwood.bench.config import config_from_options
    from redwood.bench.run import run_command

    if args.servers:
        return _cmd_bench_servers(args)

    options = {key: getattr(args, key) for key in (
        "prompts", "max_new_tokens", "temperatures", "top_ps", "methods", "hf_constant_grid",
        "prompt_sets", "lookup_grid",
        "specinfer_grid", "select_prompts", "select_tokens", "max_budget", "max_depth", "seed",
        "out_dir", "machine", "fixed_tree")}
    config = config_from_options(args.quick, plots=not args.no_plots,
                                 command=_bench_command(args), backend=_bench_backend(args),
                                 **options)
    return run_command(config, _model_config(args), args.acceptance, args.profile, args.scaling)
