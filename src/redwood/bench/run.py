"""`redwood bench`: redwood's methods against the `transformers` baselines (or, with
`--backend llamacpp`, against llama-cpp-python's own `Llama` generation and prompt lookup, see
bench.llamacpp_runners) on the HumanEval evaluation split (disjoint from the calibration split)
and on input-grounded edit tasks (bench.prompt_sets: one table per prompt set), following
docs/design.md §9.

Same prompts and the same number of new tokens for every method (EOS ignored), methods
interleaved per prompt (their order rotating from prompt to prompt), prefill excluded for
every method (estimated for `transformers`, see bench.runners), seeds fixed (prompt i uses
seed + i for every method). Reported per method x setting: median tokens/s, speedups (median
over prompts of the per-prompt ratio to `autoregressive` and to `hf_generate`), tokens per
target forward (pooled over prompts) beside the planner's prediction, and the time split.
Every record also has the end-to-end wall time of its request, prefill included: the primary
column of the llama.cpp bench, whose ratios are to plain llama.cpp (`llamacpp_plain`) on the
same prompt (median and per-prompt minimum).

This module is the orchestration: what to run is a BenchConfig (bench.config), the methods
come from bench.methods, and bench.report writes, under `out_dir`: <stem>.json (the summary
and how it was made), <stem>.raw.json (one record per method x setting x prompt), <stem>.md
(the table) and <stem>-*.png plots (bench.plots), where stem = <machine>-<date>;
`--scaling` runs bench.scaling instead.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from redwood.bench.config import BenchConfig
from redwood.bench.methods import MethodFactory
from redwood.bench.runners import Setting
from redwood.errors import RedwoodError


def run_command(config: BenchConfig, model_config=None, acceptance=(), profile=None,
                scaling: bool = False) -> int:
    """`redwood bench`: check input, load the pair, gather the plan inputs, run, write."""
    import transformers

    from redwood.bench.inputs import load_models, plan_inputs, quick_pair
    from redwood.plan.formats import Acceptance, Profile

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
        bundle = _find_bundle(model_config, config.backend)
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
        from redwood.bench.scaling import run_scaling, write_scaling

        paths = write_scaling(run_scaling(config, pair, inputs), config, pair)
    else:
        from redwood.bench.report import write_outputs

        paths = write_outputs(run_bench(config, pair, inputs))
        print(Path(paths["markdown"]).read_text().split("## Results", 1)[1].split("\n## ", 1)[0])
    for path in paths.values():
        print(f"wrote {path}")
    return 0


def _find_bundle(model_config, backend: str = "hf"):
    """The tuned bundle a real run would use (--tree auto/DIR, or the pair's shipped one for
    the backend)."""
    from redwood.measure import bundles as presets

    if model_config is None or model_config.target is not None:
        return None
    spec = model_config.tree or "auto"
    if spec != "auto" and not Path(spec).is_dir():
        return None
    try:
        return presets.find_bundle(spec, model_config.model or presets.DEFAULT_PAIR, backend)
    except RedwoodError:
        if model_config.tree is not None:
            raise
        return None


# --- the run ------------------------------------------------------------------------------

def run_bench(config: BenchConfig, pair, inputs, progress: bool = True) -> dict:
    """Benchmark every method at every setting on every prompt set; returns the report dict
    (see write_outputs). report["specs"] is keyed by (prompt set, setting)."""
    from redwood.bench.prompt_sets import describe_sets, load_prompt_sets
    from redwood.prompts import humaneval_prompts

    config.check()
    started = time.perf_counter()
    settings = bench_settings(config)
    prompts, prompt_notes = load_prompt_sets(pair, config.prompt_sets, config.prompts)
    select_ids = pair.encode(humaneval_prompts("calibration", limit=config.select_prompts)) \
        if config.select_prompts else []
    factory = MethodFactory(pair, inputs, config.hf_constant_grid, config.specinfer_grid,
                            select_ids, config.select_tokens, config.seed, config.fixed_tree,
                            config.lookup_grid, config.max_new_tokens)
    try:
        specs = {}
        for name in config.prompt_sets:
            first = next(i for i, p in enumerate(prompts) if p.prompt_set == name)
            for s in settings:
                specs[(name, s)] = factory.specs(s, config.methods, name,
                                                 (prompts[first].ids, config.seed + first))
        _warm_up(specs, prompts[0].ids, config.seed)
        records, loads = [], [os.getloadavg()[0]]
        total = len(config.methods) * len(settings) * len(prompts)
        for i, prompt in enumerate(prompts):
            for setting in settings:
                records += _run_prompt(i, prompt, setting, specs[(prompt.prompt_set, setting)],
                                       config)
                loads.append(os.getloadavg()[0])
                if progress:
                    print(f"bench: prompt {i + 1}/{len(prompts)} ({prompt.name}), {setting.label} "
                          f"done ({len(records)}/{total} runs, "
                          f"{time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
        runtime = _runtime(pair)
    finally:
        factory.close()
    return {"config": config, "settings": settings, "specs": specs, "records": records,
            "selections": [s.as_dict() for s in factory.selections], "inputs": inputs,
            "pair": pair, "elapsed_seconds": time.perf_counter() - started,
            "load_averages": loads, "runtime": runtime, "prompt_sets": describe_sets(prompts),
            "notes": prompt_notes}


def _runtime(pair) -> str | None:
    """The CPU model and the kernels / runtime, for the llama.cpp bench's table header."""
    if getattr(pair, "backend", "hf") != "llamacpp":
        return None
    from redwood.bench.llamacpp_runners import cpu_model, runtime_description

    return f"{cpu_model()}; {runtime_description(pair.target.n_threads)}"


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
    for (_, setting), items in specs.items():
        for spec in items:
            key = (spec.method, spec.config)
            if key not in seen:
                seen.add(key)
                spec.run(ids, setting, seed, 4)


def _run_prompt(index, prompt, setting, specs, config) -> list[dict]:
    """Every method on one prompt (a prompt_sets.BenchPrompt) at one setting, in an order
    rotated by the prompt's index over all sets."""
    ids = prompt.ids
    order = specs[index % len(specs):] + specs[:index % len(specs)]
    seed = config.seed + index
    results = {}
    for position, spec in enumerate(order):
        results[spec.method] = (spec, spec.run(ids, setting, seed, config.max_new_tokens), position)
    reference, plain = results.get("autoregressive"), results.get("llamacpp_plain")
    records = []
    for spec in specs:
        _, measurement, position = results[spec.method]
        same = same_plain = None
        if setting.temperature == 0 and reference is not None:
            same = measurement.tokens == reference[1].tokens
        if setting.temperature == 0 and plain is not None:
            same_plain = measurement.tokens == plain[1].tokens
        record = {"prompt": index, "prompt_set": prompt.prompt_set, "prompt_name": prompt.name,
                  "prompt_encoding": prompt.encoding, "prompt_tokens": int(len(ids)),
                  "method": spec.method,
                  "config": spec.config, "temperature": setting.temperature,
                  "top_p": setting.top_p, "seed": seed, "order": position,
                  "greedy_matches_autoregressive": same, **measurement.as_dict()}
        if plain is not None:
            record["greedy_matches_plain_llamacpp"] = same_plain
        records.append(record)
    return records
