"""`redwood tune`: profile this machine, calibrate acceptance per temperature, plan a tree for
each, and write it all as a bundle directory that `--tree auto` reads (layout: presets.py).

    result = tune(target, draft, "bundles/mine", prompts=token_id_tensors)

Optionally several draft variants (e.g. the float draft and its int8 copy) are tuned side
by side and the one the planner predicts faster (mean predicted speedup over the
temperatures) is written at the top level; the others go under alternatives/<name>/.
The directory is written under a temporary name and renamed into place, so a bundle is
never seen half-written.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from redwood.errors import RedwoodError
from redwood.plan.formats import Acceptance, Profile
from redwood.measure.bundles import BUNDLE_FORMAT, BUNDLE_INDEX, is_bundle_dir

DEFAULT_TEMPERATURES = (0.0, 0.6, 1.0)


@dataclass
class TuneSettings:
    """Everything that shapes a tuning run (recorded in bundle.json)."""
    temperatures: tuple = DEFAULT_TEMPERATURES
    top_p: float = 1.0
    top_k: int = 0
    method: str = "sequoia"
    width: int = 16                 # children of the calibration star (length of p)
    max_budget: int = 32            # largest tree (nodes incl. root) profiled and planned
    max_depth: int = 16             # most levels (root = level 1)
    context: int = 256              # cached tokens under each profiled forward
    repeats: int = 5
    warmup: int = 2
    max_new_tokens: int = 64        # per calibration prompt
    seed: int = 0
    draft_confidence: float | None = None   # adaptive trees' threshold; None: redwood.plan.adaptive's estimate

    def check(self) -> None:
        from redwood.decode.params import check_draft_confidence, check_sampling

        if not self.temperatures:
            raise RedwoodError("give at least one temperature")
        for t in self.temperatures:
            check_sampling(self.max_new_tokens, t, self.top_p, self.top_k)
        if len(set(self.temperatures)) != len(self.temperatures):
            raise RedwoodError(f"temperatures repeat: {list(self.temperatures)}")
        if self.draft_confidence is not None:
            check_draft_confidence(self.draft_confidence)
        for name in ("width", "max_budget", "max_depth", "context", "repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RedwoodError(f"{name.replace('_', '-')} must be an integer >= 1, got {value!r}")


@dataclass
class VariantResult:
    """One draft variant: its profile, and per temperature the vector and the choice."""
    name: str                        # shown and used as alternatives/<name>: "float32", "int8"
    quantize: str | None             # the draft's --draft-quantize (None: as loaded)
    profile: Profile
    acceptances: dict = field(default_factory=dict)     # temperature -> Acceptance
    choices: dict = field(default_factory=dict)         # temperature -> planner.TreeChoice
    adaptive: dict = field(default_factory=dict)        # temperature -> adaptive.AdaptivePlan

    @property
    def mean_speedup(self) -> float:
        return sum(c.speedup for c in self.choices.values()) / len(self.choices)


@dataclass
class TuneResult:
    directory: Path
    chosen: VariantResult
    variants: list[VariantResult]
    seconds: float


def temperature_tag(temperature: float) -> str:
    """File-name form of a temperature: 0 -> '0', 0.6 -> '0.6'."""
    return f"{float(temperature):g}"


def tune(target, draft, out_dir, prompts, settings: TuneSettings | None = None,
         draft_quantize: str | None = None, other_drafts: dict | None = None,
         labels: dict | None = None, dataset: str = "", command: str = "",
         progress: bool = True) -> TuneResult:
    """Profile + calibrate per temperature + plan -> a bundle directory at `out_dir`.

    prompts: calibration prompts (1-D token id tensors). draft_quantize: what `draft` is
    (None or "int8"), recorded so `--tree auto` can load the same draft. other_drafts:
    {quantize name: draft model} tuned side by side (see the module doc). labels: names of
    the models for the files ({"target": ..., "draft": ...}).
    """
    settings = settings or TuneSettings()
    settings.check()
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    labels = labels or {}
    start = time.perf_counter()
    variants = _measure(target, draft, draft_quantize, other_drafts or {}, prompts, settings,
                        labels, dataset, progress)
    chosen = max(variants, key=lambda v: v.mean_speedup)
    seconds = time.perf_counter() - start
    meta = {"labels": labels, "dataset": dataset, "command": command, "seconds": seconds,
            "prompts": len(prompts), "name": out_dir.name}
    _write_atomically(out_dir, lambda tmp: _write_bundle(tmp, chosen, variants, settings, meta))
    return TuneResult(out_dir, chosen, variants, seconds)


def _measure(target, draft, draft_quantize, other_drafts, prompts, settings, labels, dataset,
             progress) -> list[VariantResult]:
    from redwood.measure.profile import default_sizes, profile_latency

    sizes = default_sizes(settings.max_budget)
    profile = profile_latency(target, draft, context=settings.context, budgets=sizes,
                              repeats=settings.repeats, warmup=settings.warmup,
                              progress=progress, seed=settings.seed)
    from redwood.measure.profile import model_dtype

    variants = [VariantResult(draft_quantize or model_dtype(draft), draft_quantize, profile)]
    for name, model in other_drafts.items():
        # The target's times are shared; only the draft's are measured again.
        other = profile_latency(target, model, context=settings.context, budgets=[1],
                                widths=sizes, repeats=settings.repeats, warmup=settings.warmup,
                                progress=progress, seed=settings.seed)
        merged = Profile(target_ms=profile.target_ms, draft_ms=other.draft_ms,
                         device=profile.device, dtype=profile.dtype, context=profile.context,
                         extra={**profile.extra, "draft_dtype": other.extra["draft_dtype"],
                                "fast_linear": {**profile.extra["fast_linear"],
                                                "draft": other.extra["fast_linear"]["draft"]},
                                "samples_ms": {"target": profile.extra["samples_ms"]["target"],
                                               "draft": other.extra["samples_ms"]["draft"]}})
        variants.append(VariantResult(name, name, merged))
    models = {variants[0].name: draft, **other_drafts}
    for variant in variants:
        for temperature in settings.temperatures:
            _calibrate_and_plan(target, models[variant.name], variant, float(temperature),
                                prompts, settings, labels, dataset, progress)
    return variants


def _calibrate_and_plan(target, draft, variant, temperature, prompts, settings, labels,
                        dataset, progress) -> None:
    from redwood.measure.calibrate import calibrate
    from redwood.plan.adaptive import plan_adaptive
    from redwood.plan.planner import choose_tree

    acceptance = calibrate(target, draft, prompts, temperature, top_p=settings.top_p,
                           top_k=settings.top_k, method=settings.method, width=settings.width,
                           max_new_tokens=settings.max_new_tokens, seed=settings.seed,
                           progress=progress, dataset=dataset, target_name=labels.get("target"),
                           draft_name=_draft_label(labels.get("draft"), variant.quantize))
    choice = choose_tree(acceptance, variant.profile, settings.max_budget, settings.max_depth)
    tag = temperature_tag(temperature)
    choice.tree.source.update({
        "tool": "redwood tune", "temperature": temperature, "top_p": settings.top_p,
        "top_k": settings.top_k or None, "method": settings.method,
        "draft_quantize": variant.quantize,
        "fast_linear": _fast_linear(variant.profile),
        "acceptance": f"acceptance-{tag}.json", "profile": "profile.json",
        "predicted_tokens_per_step": choice.tokens_per_step})
    variant.acceptances[temperature] = acceptance
    variant.choices[temperature] = choice
    variant.adaptive[temperature] = plan_adaptive(acceptance.p, variant.profile, choice,
                                                  settings.max_budget, settings.max_depth,
                                                  settings.draft_confidence)


def _fast_linear(profile: Profile) -> bool:
    """Whether the models were timed with --fast-linear (so the engine must load them so)."""
    return bool(profile.extra.get("fast_linear", {}).get("target", False))


def _draft_label(label, quantize) -> str | None:
    if label is None or quantize is None:
        return label
    return f"{label} ({quantize})"


# --- writing the bundle ----------------------------------------------------------------

def check_out_dir(out_dir: Path) -> None:
    """Fail before minutes of measuring if the bundle cannot be written there."""
    if out_dir.exists() and not out_dir.is_dir():
        raise RedwoodError(f"--out {out_dir} is a file; give a directory for the bundle")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not is_bundle_dir(out_dir):
        raise RedwoodError(f"--out {out_dir} is a non-empty directory that is not a bundle; "
                           "give a new or empty directory (an old bundle there is replaced)")
    parent = out_dir.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RedwoodError(f"cannot create {parent}: {exc.strerror}") from None
    if not os.access(parent, os.W_OK):
        raise RedwoodError(f"cannot write in {parent}; choose another --out")


def _write_atomically(out_dir: Path, write) -> None:
    """write(tmp_dir) fills a fresh sibling directory, which then replaces out_dir."""
    parent = out_dir.resolve().parent
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    old = None
    try:
        write(tmp)
        os.chmod(tmp, 0o755)
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=parent))
            os.rename(out_dir, old / "bundle")
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out_dir.exists():
            os.rename(old / "bundle", out_dir)          # put the previous bundle back
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _write_bundle(directory: Path, chosen: VariantResult, variants, settings, meta) -> None:
    from redwood.measure import tune_summary as tunesummary

    _write_variant(directory, chosen)
    for variant in variants:
        if variant is not chosen:
            sub = directory / "alternatives" / variant.name
            sub.mkdir(parents=True)
            _write_variant(sub, variant)
    _write_plots(directory, chosen, variants)
    index = bundle_index(meta["name"], chosen, variants, settings, meta)
    (directory / BUNDLE_INDEX).write_text(json.dumps(index, indent=1) + "\n")
    (directory / "summary.md").write_text(tunesummary.bundle_summary(index, chosen, variants))


def _write_variant(directory: Path, variant: VariantResult) -> None:
    from redwood.plan import render

    variant.profile.save(directory / "profile.json")
    for temperature, acceptance in variant.acceptances.items():
        tag = temperature_tag(temperature)
        choice = variant.choices[temperature]
        acceptance.save(directory / f"acceptance-{tag}.json")
        choice.tree.save(directory / f"tree-{tag}.json", acceptance.p)
        if temperature in variant.adaptive:
            variant.adaptive[temperature].tree.save(directory / f"adaptive-{tag}.json", acceptance.p)
        render.save_plan_figure(directory / f"tree-{tag}.png", choice.tree, choice.table,
                                p=acceptance.p, choice=choice)


def _write_plots(directory: Path, chosen: VariantResult, variants) -> None:
    from redwood.measure import tune_plots as tuneplots

    tuneplots.save_profile_figure(directory / "profile.png", chosen.profile,
                                  title=chosen.profile.device)
    vectors = {f"{v.name} draft, T = {temperature_tag(t)}" if len(variants) > 1
               else f"T = {temperature_tag(t)}": a
               for v in variants for t, a in v.acceptances.items()}
    tuneplots.save_acceptance_figure(directory / "acceptance.png", vectors)


def _entries(variant: VariantResult, prefix: str = "") -> list[dict]:
    out = []
    for temperature, choice in variant.choices.items():
        tag = temperature_tag(temperature)
        out.append({"temperature": temperature, "top_p": variant.acceptances[temperature].top_p,
                    "tree": f"{prefix}tree-{tag}.json",
                    "acceptance": f"{prefix}acceptance-{tag}.json",
                    "budget": choice.budget, "depth": choice.depth,
                    "level_sizes": choice.tree.level_sizes,
                    "tokens_per_step": choice.tokens_per_step, "step_ms": choice.step_ms,
                    "predicted_speedup": choice.speedup,
                    # the default drafter at this temperature (`--drafter auto` with
                    # --bundle-latencies; other machines re-plan): free drafts alone when no
                    # draft-model tree beats plain decoding here, else both
                    "drafter": default_drafter(choice.budget)})
        plan = variant.adaptive.get(temperature)
        if plan is not None:
            out[-1]["adaptive"] = adaptive_entry(plan, f"{prefix}adaptive-{tag}.json")
    return out


def default_drafter(budget: int) -> str:
    """"ngram" when the planner declined to speculate with the model (budget 1), else "hybrid"."""
    return "ngram" if budget == 1 else "hybrid"


def adaptive_entry(plan, file_name: str) -> dict:
    """A bundle entry's "adaptive" record (see redwood.plan.adaptive)."""
    return {"tree": file_name, "draft_confidence": plan.draft_confidence,
            "threshold_from": plan.threshold_from,
            "estimated_confidence": plan.estimated_confidence,
            "nodes": len(plan.tree), "depth": plan.tree.num_levels,
            "marginal_ms": plan.marginal_ms, "ms_per_token": plan.ms_per_token}


def bundle_index(name: str, chosen: VariantResult, variants, settings, meta) -> dict:
    from redwood import __version__

    alternatives = [{"draft_quantize": v.quantize,
                     "directory": f"alternatives/{v.name}",
                     "mean_predicted_speedup": v.mean_speedup,
                     "trees": _entries(v, f"alternatives/{v.name}/")}
                    for v in variants if v is not chosen]
    return {"format": BUNDLE_FORMAT, "kind": "bundle", "name": name,
            "target": meta["labels"].get("target", ""), "draft": meta["labels"].get("draft", ""),
            "draft_quantize": chosen.quantize, "fast_linear": _fast_linear(chosen.profile),
            "mean_predicted_speedup": chosen.mean_speedup,
            "device": chosen.profile.device, "dtype": chosen.profile.dtype,
            "backend": chosen.profile.extra.get("backend", "hf"),
            "draft_dtype": chosen.profile.extra.get("draft_dtype"),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "redwood": __version__, "command": meta["command"],
            "seconds": round(meta["seconds"], 1), "dataset": meta["dataset"],
            "prompts": meta["prompts"], "settings": asdict(settings) | {
                "temperatures": list(settings.temperatures)},
            "profile": "profile.json", "trees": _entries(chosen), "alternatives": alternatives}


# --- model selection for the CLI verbs ---------------------------------------------------

@dataclass
class LoadedPair:
    target: object
    draft: object
    tokenizer: object | None        # None for --quick (prompts are random token ids)
    labels: dict                    # {"target": ..., "draft": ...} for the output files
    draft_quantize: str | None
    pair: str | None                # shipped pair name, if one was used
    backend: str = "hf"             # "hf" or "llamacpp": the runtime the models run on


QUICK_SETTINGS = dict(width=8, max_budget=16, max_depth=8, context=32, repeats=2, warmup=1,
                      max_new_tokens=24)
QUICK_PROMPTS = 6


def load_models(config, quick: bool = False, progress: bool = True) -> LoadedPair:
    """The pair a textgen.ModelConfig names (as `generate` loads it), or with `quick` a tiny
    random pair built in-process (redwood.models.tiny_random)."""
    if quick:
        import torch

        from redwood.models.tiny_random import tiny_pair

        # Tiny models gain nothing from threads, and OpenMP barriers on a busy machine
        # make every small op cost milliseconds.
        torch.set_num_threads(1)
        target, draft = tiny_pair()
        return LoadedPair(target, draft, None, {"target": "tiny random qwen2 (--quick)",
                                                "draft": "the target's first layer (--quick)"},
                          None, None)
    from redwood.models.runtime import load_models as load_on_backend
    from redwood.models.shipped import DEFAULT_PAIR, shipped_pair

    if config.model is not None and (config.target or config.draft):
        raise RedwoodError("give either --model or --target/--draft, not both")
    pair = None if config.target else (config.model or DEFAULT_PAIR)
    if pair is not None:
        spec = shipped_pair(pair)                      # unknown names fail before loading
        labels = {"target": f"{pair}: {spec.target.description}",
                  "draft": f"{pair}: {spec.draft.description}"}
    else:
        labels = {"target": str(config.target), "draft": str(config.draft)}
    loaded = load_on_backend(config.model, target=config.target, draft=config.draft,
                             backend=getattr(config, "backend", "auto"), dtype=config.dtype,
                             device=config.device, draft_quantize=config.draft_quantize,
                             progress=progress, fast_linear=config.fast_linear)
    return LoadedPair(loaded.target, loaded.draft, loaded.tokenizer, labels, config.draft_quantize,
                      pair, loaded.backend)


def int8_copy(model):
    """A dynamically int8-quantised copy of a (float, CPU) draft, the original untouched."""
    import copy

    from redwood.models.cpu_kernels import disable_fast_linear, quantize_int8

    clone = copy.deepcopy(model)
    disable_fast_linear(clone)          # a copied fast forward would still read the original
    return quantize_int8(clone)


def prompts_for(loaded: LoadedPair, source: str, count: int | None, quick: bool = False):
    """(calibration prompts as token ids, dataset label)."""
    if quick or loaded.tokenizer is None:
        from redwood.models.tiny_random import random_prompts

        from redwood.decode.request import as_backend

        vocab = as_backend(loaded.target).vocab_size
        n = count or QUICK_PROMPTS
        return random_prompts(n, vocab), f"{n} random token prompts (--quick)"
    from redwood.measure.calibrate import calibration_prompts

    return calibration_prompts(loaded.tokenizer, source, count)
