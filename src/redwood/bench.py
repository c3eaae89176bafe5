"""`redwood bench`: redwood's methods against the `transformers` baselines on the HumanEval
evaluation split (disjoint from the calibration split), following DESIGN.md §6.

Same prompts and the same number of new tokens for every method (EOS ignored), methods
interleaved per prompt (their order rotating from prompt to prompt), prefill excluded for
every method (estimated for `transformers`, see bench_runners), seeds fixed (prompt i uses
seed + i for every method). Reported per method x setting: median tokens/s, speedups (median
over prompts of the per-prompt ratio to `autoregressive` and to `hf_generate`), tokens per
target forward (pooled over prompts) beside the planner's prediction, and the time split.

bench_report writes, under `out_dir`: <stem>.json (the summary and how it was made),
<stem>.raw.json (one record per method x setting x prompt), <stem>.md (the table) and
<stem>-*.png plots (bench_plots), where stem = <machine>-<date>.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from redwood.bench_methods import METHODS, MethodFactory, parse_specinfer_grid
from redwood.bench_runners import Setting
from redwood.errors import RedwoodError

# The full specification; anything less is listed as a reduction in the output.
FULL_SPEC = {"prompts": 20, "max_new_tokens": 128, "temperatures": (0.0, 0.6, 1.0),
             "top_ps": (1.0, 0.9), "methods": METHODS}
QUICK = {"prompts": 2, "max_new_tokens": 12, "hf_constant_grid": (2, 4),
         "specinfer_grid": ((2, 2), (3, 1)), "select_tokens": 8}


@dataclass
class BenchConfig:
    prompts: int = 20
    max_new_tokens: int = 128
    temperatures: tuple = (0.0, 0.6, 1.0)
    top_ps: tuple = (1.0, 0.9)
    methods: tuple = METHODS
    hf_constant_grid: tuple = (2, 3, 4, 6, 8)
    specinfer_grid: tuple = ((2, 1), (2, 2), (2, 3), (3, 1), (3, 2), (4, 2))
    select_prompts: int = 1            # calibration-split prompts for grid choices (0: planner)
    select_tokens: int = 32
    seed: int = 0
    max_budget: int = 32               # planning limits when a tree is planned here
    max_depth: int = 12
    out_dir: str = "benchmarks/results"
    machine: str | None = None
    stem: str | None = None            # output file stem (default <machine>-<date>)
    plots: bool = True
    quick: bool = False
    command: str = ""
    notes: list = field(default_factory=list)

    def check(self) -> None:
        """RedwoodError on bad input, before any model loads."""
        from redwood.engine import check_sampling
        from redwood.prompts import EVALUATION

        _positive(self.prompts, "--prompts")
        if self.prompts > len(EVALUATION):
            raise RedwoodError(f"--prompts {self.prompts}: the evaluation split has only "
                               f"{len(EVALUATION)} prompts")
        _positive(self.select_tokens, "--select-tokens")
        if isinstance(self.select_prompts, bool) or not isinstance(self.select_prompts, int) \
                or not 0 <= self.select_prompts <= 40:
            raise RedwoodError("--select-prompts must be an integer in 0..40 (calibration split)")
        if not self.temperatures or not self.top_ps:
            raise RedwoodError("give at least one temperature and one top_p")
        for t in self.temperatures:
            for p in self.top_ps:
                check_sampling(self.max_new_tokens, t, p, 0)
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise RedwoodError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; "
                               f"choose from {', '.join(METHODS)}")
        for k in self.hf_constant_grid:
            _positive(k, "--hf-constant-grid entries")
        self.specinfer_grid = tuple(parse_specinfer_grid(self.specinfer_grid))
        _positive(self.max_budget, "--max-budget")
        _positive(self.max_depth, "--max-depth")

    def reductions(self) -> list[str]:
        """How this run falls short of the issue's full specification."""
        out = []
        if self.quick:
            out.append("--quick: tiny random models, not the real pair (a pipeline check, "
                       "not a measurement)")
        if self.prompts < FULL_SPEC["prompts"]:
            out.append(f"{self.prompts} prompts instead of {FULL_SPEC['prompts']}")
        if self.max_new_tokens < FULL_SPEC["max_new_tokens"]:
            out.append(f"{self.max_new_tokens} new tokens instead of {FULL_SPEC['max_new_tokens']}")
        for key, label in (("temperatures", "temperature"), ("top_ps", "top_p"),
                           ("methods", "method")):
            missing = [x for x in FULL_SPEC[key] if x not in getattr(self, key)]
            if missing:
                out.append(f"{label}s {', '.join(map(str, missing))} not run")
        if "hf_assisted_constant" in self.methods and len(self.hf_constant_grid) == 1:
            out.append(f"assisted constant k fixed at {self.hf_constant_grid[0]} (no grid)")
        grids = (("hf_assisted_constant", self.hf_constant_grid),
                 ("specinfer", self.specinfer_grid))
        if self.select_prompts == 0 and any(m in self.methods and len(g) > 1 for m, g in grids):
            out.append("grid entries chosen by the planner's objective (predicted tokens/s), "
                       "not measured on calibration prompts")
        if "specinfer" in self.methods and len(self.specinfer_grid) == 1:
            k, d = self.specinfer_grid[0]
            out.append(f"specinfer fixed at {k}x{d} (no grid)")
        return out


def _positive(value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RedwoodError(f"{what} must be an integer >= 1, got {value!r}")


def quick_config(**overrides) -> BenchConfig:
    """A BenchConfig for --quick: tiny pair, few prompts and tokens, small grids."""
    config = BenchConfig(quick=True, machine="quick", **QUICK)
    for key, value in overrides.items():
        if value is not None:
            setattr(config, key, value)
    return config


def config_from_options(quick: bool, **options) -> BenchConfig:
    """A BenchConfig from CLI-style options (None = the default of the mode)."""
    base = quick_config() if quick else BenchConfig()
    for key, value in options.items():
        if value is None:
            continue
        if key in ("temperatures", "top_ps", "methods", "hf_constant_grid"):
            value = tuple(value)
        setattr(base, key, value)
    base.check()
    return base


def run_command(config: BenchConfig, model_config=None, acceptance=(), profile=None,
                scaling: bool = False) -> int:
    """`redwood bench`: check input, load the pair, gather the plan inputs, run, write."""
    import transformers

    from redwood.bench_inputs import load_models, plan_inputs, quick_pair
    from redwood.formats import Acceptance, Profile

    config.check()
    for path in acceptance:                  # fail on bad files before loading models
        Acceptance.load(path)
    if profile:
        Profile.load(profile)
    transformers.logging.set_verbosity_error()
    if config.quick:
        if model_config is not None and (model_config.model or model_config.target
                                         or model_config.draft):
            raise RedwoodError("--quick uses tiny built-in models; drop --model/--target/--draft")
        import torch

        torch.set_num_threads(1)    # tiny models: OpenMP barriers cost more than they save
        pair = quick_pair()
    else:
        bundle = _find_bundle(model_config)
        if bundle is None and not acceptance:
            raise RedwoodError("no acceptance vectors: run `redwood tune` for a tuned bundle "
                               "(--tree auto / DIR) or pass --acceptance FILE [FILE ...] from "
                               "`redwood calibrate`")
        pair = load_models(model_config, bundle)
    tree = model_config.tree if model_config is not None else None
    inputs = plan_inputs(pair, acceptance, profile, tree, config.max_budget, config.max_depth,
                         config.temperatures, config.seed)
    if not inputs.vectors:
        raise RedwoodError("no acceptance vectors: run `redwood tune` for a tuned bundle "
                           "(--tree auto / DIR) or pass --acceptance FILE [FILE ...] from "
                           "`redwood calibrate`")
    if scaling:
        from redwood.bench_scaling import run_scaling, write_scaling

        paths = write_scaling(run_scaling(config, pair, inputs), config, pair)
    else:
        from redwood.bench_report import write_outputs

        paths = write_outputs(run_bench(config, pair, inputs))
        print(Path(paths["markdown"]).read_text().split("## Results", 1)[1].split("##", 1)[0])
    for path in paths.values():
        print(f"wrote {path}")
    return 0


def _find_bundle(model_config):
    """The tuned bundle a real run would use (--tree auto/DIR, or the pair's shipped one)."""
    from redwood import presets

    if model_config is None or model_config.target is not None:
        return None
    spec = model_config.tree or "auto"
    if spec != "auto" and not Path(spec).is_dir():
        return None
    try:
        return presets.find_bundle(spec, model_config.model or presets.DEFAULT_PAIR)
    except RedwoodError:
        if model_config.tree is not None:
            raise
        return None


def machine_name() -> str:
    """A short label for this machine: cpu-<N>core or cuda-<gpu name>."""
    import torch

    if torch.cuda.is_available():
        return "cuda-" + "".join(c if c.isalnum() else "-" for c in
                                 torch.cuda.get_device_name(0).lower()).strip("-")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"cpu-{cores}core"


# --- the run ------------------------------------------------------------------------------

def run_bench(config: BenchConfig, pair, inputs, progress: bool = True) -> dict:
    """Benchmark every method at every setting; returns the report dict (see write_outputs)."""
    from redwood.prompts import humaneval_prompts

    config.check()
    started = time.perf_counter()
    settings = bench_settings(config)
    eval_ids = pair.encode(humaneval_prompts("evaluation", limit=config.prompts))
    select_ids = pair.encode(humaneval_prompts("calibration", limit=config.select_prompts)) \
        if config.select_prompts else []
    factory = MethodFactory(pair, inputs, config.hf_constant_grid, config.specinfer_grid,
                            select_ids, config.select_tokens, config.seed)
    specs = {s: factory.specs(s, config.methods) for s in settings}
    _warm_up(specs, eval_ids[0], config.seed)
    records, loads = [], [os.getloadavg()[0]]
    total = len(eval_ids) * sum(len(v) for v in specs.values())
    for i, ids in enumerate(eval_ids):
        for setting in settings:
            records += _run_prompt(i, ids, setting, specs[setting], config)
            loads.append(os.getloadavg()[0])
            if progress:
                print(f"bench: prompt {i + 1}/{len(eval_ids)}, {setting.label} done "
                      f"({len(records)}/{total} runs, {time.perf_counter() - started:.0f} s)",
                      file=sys.stderr, flush=True)
    return {"config": config, "settings": settings, "specs": specs, "records": records,
            "selections": [s.as_dict() for s in factory.selections], "inputs": inputs,
            "pair": pair, "elapsed_seconds": time.perf_counter() - started,
            "load_averages": loads}


def bench_settings(config: BenchConfig) -> list[Setting]:
    """Temperatures x top_p values; greedy ignores top_p, so T = 0 runs once (largest top_p)."""
    settings = []
    for t in config.temperatures:
        for p in ([max(config.top_ps)] if t == 0 else config.top_ps):
            if Setting(float(t), float(p)) not in settings:
                settings.append(Setting(float(t), float(p)))
    return settings


def _warm_up(specs, ids, seed) -> None:
    """One short untimed run of every distinct method configuration (lazy kernels, caches)."""
    seen = set()
    for setting, items in specs.items():
        for spec in items:
            key = (spec.method, spec.config)
            if key not in seen:
                seen.add(key)
                spec.run(ids, setting, seed, 4)


def _run_prompt(index, ids, setting, specs, config) -> list[dict]:
    """Every method on one prompt at one setting, in an order rotated by the prompt index."""
    order = specs[index % len(specs):] + specs[:index % len(specs)]
    seed = config.seed + index
    results = {}
    for position, spec in enumerate(order):
        results[spec.method] = (spec, spec.run(ids, setting, seed, config.max_new_tokens), position)
    reference = results.get("autoregressive")
    records = []
    for spec in specs:
        _, measurement, position = results[spec.method]
        same = None
        if setting.temperature == 0 and reference is not None:
            same = measurement.tokens == reference[1].tokens
        records.append({"prompt": index, "prompt_tokens": int(len(ids)), "method": spec.method,
                        "config": spec.config, "temperature": setting.temperature,
                        "top_p": setting.top_p, "seed": seed, "order": position,
                        "greedy_matches_autoregressive": same, **measurement.as_dict()})
    return records
