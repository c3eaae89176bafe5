"""`redwood profile`, `calibrate` and `tune`: the measuring verbs of the CLI (`bench` is
in cli/bench.py).

Same conventions as cli.py: `_add_<verb>` declares arguments, `_cmd_<verb>` runs the
library function; user errors raise RedwoodError.
"""
from __future__ import annotations

from redwood.cli.options import _add_model_args, _add_quick, _model_config
from redwood.errors import RedwoodError


# --- profile / calibrate / tune (tuning issue) -----------------------------------------

def _no_tree(args, drafters=("model",)):
    if getattr(args, "drafter", None) is None:
        args.drafter = "model"               # measuring verbs measure the draft model by default
    if args.tree is not None:
        raise RedwoodError(f"--tree does not apply to `redwood {args.verb}` (it measures the "
                           "models; `redwood tune` makes trees)")
    if getattr(args, "drafter", "model") not in drafters:
        raise RedwoodError(f"--drafter {args.drafter} does not apply to `redwood {args.verb}`: it "
                           f"measures {' or '.join(drafters)} drafts (`redwood calibrate "
                           "--drafter ngram` calibrates the n-gram drafter; `redwood tune "
                           "--drafter hybrid|auto` tunes both sources into one bundle)")


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
    from redwood.measure.profile import default_sizes, profile_latency
    from redwood.measure.tune import load_models

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
        from redwood.measure.tune_plots import save_profile_figure

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
    p.add_argument("--prompts", default="humaneval",
                   metavar="humaneval|edits|chat|FILE.jsonl",
                   help="the HumanEval calibration split (default), its edit tasks (edits: "
                   "input-grounded, for --drafter ngram), the chat set's calibration split "
                   "(chat: free-form answers) or a JSONL file of "
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
    if args.prompts not in ("humaneval", "edits", "chat"):
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
    p.add_argument("--add-to", metavar="BUNDLE", default=None,
                   help="with --drafter ngram: also add these counts to the bundle "
                   "directory's n-gram calibration (its priors: more text, same keys)")
    _add_quick(p)
    p.set_defaults(func=_cmd_calibrate)


def _cmd_calibrate(args):
    from redwood.measure.calibrate import calibrate
    from redwood.decode.params import check_sampling
    from redwood.measure.tune import QUICK_SETTINGS, load_models, prompts_for

    _no_tree(args, ("model", "ngram"))
    width = _given(args.width, QUICK_SETTINGS["width"] if args.quick else 16)
    max_new = _given(args.max_new_tokens, QUICK_SETTINGS["max_new_tokens"] if args.quick else 64)
    if isinstance(width, bool) or width < 1:
        raise RedwoodError(f"--width must be >= 1, got {width}")
    check_sampling(max_new, args.temperature, args.top_p, args.top_k)
    _prompt_source_check(args)
    _writable_file(args.out, "--out")
    if args.plot:
        _writable_file(args.plot, "--plot")
    if args.add_to is not None and args.drafter != "ngram":
        raise RedwoodError("--add-to adds n-gram counts to a bundle: add --drafter ngram")
    if args.drafter == "ngram":
        from redwood.cli.ngram_measure import check_bundle_dir, cmd_calibrate_ngram

        if args.add_to is not None:
            check_bundle_dir(args.add_to)
        return cmd_calibrate_ngram(args, max_new, _command_line(args))
    if args.prompts == "edits":
        raise RedwoodError("--prompts edits calibrates the n-gram drafter: add --drafter ngram")
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
        from redwood.measure.tune_plots import save_acceptance_figure

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
    from redwood.measure.tune import QUICK_SETTINGS, TuneSettings

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
                               "seed": args.seed, "draft_confidence": args.draft_confidence})
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

    _no_tree(args, ("model", "ngram", "hybrid", "auto"))
    from redwood.measure.tune import check_out_dir, int8_copy, load_models, prompts_for, tune

    if args.prompts == "edits":
        raise RedwoodError("tune calibrates the draft model on humaneval or a prompt file; its "
                           "n-gram calibration (--drafter ngram|hybrid|auto) uses the edit tasks")

    settings = _tune_settings(args)
    _prompt_source_check(args)
    if args.compare_int8_draft and args.draft_quantize:
        raise RedwoodError("--compare-int8-draft tunes the float draft and an int8 copy; "
                           "drop --draft-quantize")
    check_out_dir(Path(args.out))
    pair = load_models(_model_config(args), quick=args.quick)
    prompts, dataset = prompts_for(pair, args.prompts, args.num_prompts or (None if args.quick else 8),
                                   quick=args.quick)
    if args.compare_int8_draft and pair.backend != "hf":
        raise RedwoodError("--compare-int8-draft applies to the transformers backend (--backend hf)")
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
    if args.drafter != "model":
        from redwood.cli.ngram_measure import add_to_bundle

        add_to_bundle(args, pair, Path(result.directory), settings.temperatures,
                      settings.max_new_tokens)
    print(f"wrote {result.directory} in {result.seconds:.0f} s "
          f"(use: redwood generate --tree {result.directory} ...)")
    return 0
