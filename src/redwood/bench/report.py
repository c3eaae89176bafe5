"""The benchmark's numbers and documents: per method x setting summary rows computed from
the per-prompt records, the summary JSON, the raw JSON and the markdown table."""
from __future__ import annotations

import datetime
import json
import statistics
from dataclasses import asdict
from pathlib import Path

from redwood.bench import llamacpp_report
from redwood.bench.common import METHOD_LABELS, atomic_write, cpu_cores, duration, machine_name
from redwood.bench.methods import HF_METHODS
from redwood.bench.plots import save_plots
from redwood.measure.machine_profile import cpu_model


def _fmt(value, pattern="{:.2f}", missing="–") -> str:
    return missing if value is None else pattern.format(value)


def _split(row) -> str:
    s = row["time_split"]
    return f"{100 * s['target']:.0f} / {100 * s['draft']:.0f} / {100 * s['other']:.0f}"


def _same(row) -> str:
    value = row["greedy_matches_autoregressive"]
    return "–" if value is None else ("yes" if value else "no")


def results_table(rows) -> list[str]:
    """Transformers backend. Primary: end-to-end seconds per request (prefill included) and
    its ratios to redwood's autoregressive decoding and to HF assisted generation (default
    schedule) on the same prompt: median and worst prompt. Decode-only figures after."""
    lines = ["| method | config | T | top_p | end-to-end s | × AR (median) | × AR (worst) | "
             "× HF assisted (median) | × HF assisted (worst) | decode tokens/s | × AR decode | "
             "tokens/step | by source | predicted | time % target / draft / other | greedy = AR |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {METHOD_LABELS.get(r['method'], r['method'])} | {r['config']} | "
            f"{r['temperature']:g} | {r['top_p']:g} | {_fmt(r['end_to_end_seconds'], '{:.3f}')} | "
            f"{_fmt(r['end_to_end_vs_autoregressive'])} | "
            f"{_fmt(r['end_to_end_vs_autoregressive_min'])} | "
            f"{_fmt(r['end_to_end_vs_hf_assisted'])} | {_fmt(r['end_to_end_vs_hf_assisted_min'])} | "
            f"{r['tokens_per_second']:.2f} | {_fmt(r['speedup_vs_autoregressive'])} | "
            f"{r['tokens_per_step']:.2f} | {llamacpp_report.by_source(r)} | "
            f"{_fmt(r['predicted_tokens_per_step'])} | {_split(r)} | {_same(r)} |")
    return lines


def goal_lines(rows) -> list[str]:
    """The issue's goals, per setting, from the summary rows."""
    lines = []
    settings = sorted({(r["temperature"], r["top_p"]) for r in rows})
    for t, p in settings:
        here = {r["method"]: r for r in rows if r["temperature"] == t and r["top_p"] == p}
        seq = here.get("sequoia")
        if seq is None:
            continue
        parts = [f"**T={t:g}, top_p={p:g}**: sequoia {_fmt(seq['speedup_vs_autoregressive'])}x "
                 f"vs autoregressive"]
        hf = [here[m] for m in ("hf_assisted_default", "hf_assisted_constant") if m in here]
        if hf:
            best = max(hf, key=lambda r: r["tokens_per_second"])
            parts.append(f"{seq['tokens_per_second'] / best['tokens_per_second']:.2f}x vs the "
                         f"best HF assisted ({best['config']})")
        if "chain" in here:
            parts.append(f"{seq['tokens_per_second'] / here['chain']['tokens_per_second']:.2f}x "
                         f"vs the tuned chain ({here['chain']['config']})")
        if seq["predicted_tokens_per_step"]:
            error = seq["tokens_per_step"] / seq["predicted_tokens_per_step"] - 1
            parts.append(f"tokens/step {seq['tokens_per_step']:.2f} vs predicted "
                         f"{seq['predicted_tokens_per_step']:.2f} ({100 * error:+.0f}%)")
        tree = seq.get("tree_parents") or []
        if len(tree) > 1 and tree == [-1] + list(range(len(tree) - 1)):
            planned = seq["chosen_by"].startswith(("tuned bundle", "planned"))
            parts.append("the planner chose a chain for this machine (the hardware-aware answer)"
                         if planned else "the given tree is a chain")
        lines.append("- " + "; ".join(parts))
    return lines


def markdown(doc: dict) -> str:
    llamacpp = doc.get("backend") == "llamacpp"
    title = f"# redwood bench: {doc['machine']}, {doc['date']}"
    lines = [title + (" (llama.cpp backend)" if llamacpp else ""), ""]
    if llamacpp:
        lines += [f"**{doc['runtime']}**", ""]
    lines += [f"- command: `{doc['command']}`" if doc.get("command") else "- command: (API call)",
              f"- models: {doc['models']}",
             f"- wall time: {duration(doc['elapsed_seconds'])} (model loading excluded)",
             f"- cpu: {doc.get('cpu') or 'not recorded'}, {cpu_cores()} cores",
             f"- latency profile: {doc['profile']}",
             f"- raw per-prompt records: `{doc['raw']}`"]
    load = doc.get("load_average_1min") or {}
    if load.get("samples"):
        lines.append(f"- machine load (1-min average, {load['cores']} cores) during the run: "
                     f"start {load['start']:.2f}, max {load['max']:.2f}")
    lines.append("")
    lines.append("Reduced versus the issue's full specification (20 prompts, 128 tokens, "
                 "T in {0, 0.6, 1.0}, top_p in {1.0, 0.9}, all methods, grids):")
    lines += [f"- {r}" for r in doc["reductions"]] or ["- nothing: full specification"]
    lines += _results_section(doc, llamacpp)
    lines += ["", "## How each method was configured", ""]
    lines += _configured(doc, llamacpp)
    for sel in doc["selections"]:
        cells = ", ".join(f"{c['config']}: " + _candidate(c) for c in sel["candidates"])
        where = f" on {sel['prompt_set']}" if sel.get("prompt_set") else ""
        lines.append(f"- grid for {sel['method']}{where} at T={sel['temperature']:g}, "
                     f"top_p={sel['top_p']:g}: {cells} -> {sel['chosen']}")
    lines += ["", "## Acceptance vectors used", ""]
    for v in doc["vectors"]:
        head = ", ".join(f"{x:.3f}" for x in v["p"][:6])
        lines.append(f"- T={v['temperature']}, top_p={v['top_p']}, {v['method']}: "
                     f"p = [{head}{', ...' if len(v['p']) > 6 else ''}] ({v['source']})")
    lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    if doc.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{k}]({name})" for k, name in doc["plots"].items()]
    return "\n".join(lines) + "\n"


def _configured(doc: dict, llamacpp: bool) -> list[str]:
    """One line per method x setting x configuration (the prompt sets it applies to named
    when there are several and they differ)."""
    sets: dict[tuple, list[str]] = {}
    for r in doc["summary"]:
        if r["method"] not in ("autoregressive", "hf_generate") or \
                (llamacpp and r["method"] == "autoregressive"):
            key = (r["method"], r["temperature"], r["top_p"], r["config"], r["chosen_by"])
            sets.setdefault(key, []).append(r.get("prompt_set", "humaneval"))
    every = len(doc.get("prompt_sets") or {}) <= 1
    lines = []
    for (method, t, p, config, how), names in sets.items():
        where = "" if every or len(names) == len(doc["prompt_sets"]) else \
            f" on {', '.join(names)}"
        lines.append(f"- {method}{where} at T={t:g}, top_p={p:g}: {config} ({how})")
    return lines


def _candidate(c: dict) -> str:
    if "tokens_per_second" in c:
        return f"{c['tokens_per_second']:.2f} tok/s"
    if "end_to_end_seconds" in c:
        return f"{c['end_to_end_seconds']:.3f} s end to end"
    return f"{_fmt(c['predicted_tokens_per_second'])} tok/s predicted"


def _set_title(name: str, info: dict | None) -> str:
    if not info:
        return name
    low, high = min(info["prompt_tokens"]), max(info["prompt_tokens"])
    count = info["prompts"]
    return (f"{name} ({count} prompt{'s' if count != 1 else ''}, {info['encoding']} encoding, "
            f"{low if low == high else f'{low}-{high}'} prompt tokens)")


def _results_section(doc: dict, llamacpp: bool) -> list[str]:
    """## Results (one table per prompt set, under its own heading when there are several
    sets or the set is not HumanEval) and ## Against the goals (per set)."""
    sets = doc.get("prompt_sets") or {}
    names = list(dict.fromkeys(r.get("prompt_set", "humaneval") for r in doc["summary"]))
    titled = len(names) > 1 or names != ["humaneval"]
    caption = llamacpp_report.caption(doc) if llamacpp else (
        "End to end (prefill included) is the primary figure. Decode-only (secondary): redwood's "
        "speculative methods fuse the target's prompt pass into their first verification, so it "
        "counts as decode time there and understates their decode rate.")
    lines = ["", "## Results", "", caption, ""]
    goals = []
    for name in names:
        rows = [r for r in doc["summary"] if r.get("prompt_set", "humaneval") == name]
        if titled:
            lines += [f"### {_set_title(name, sets.get(name))}", ""]
        lines += (llamacpp_report.results_table(rows) if llamacpp else results_table(rows))
        lines.append("")
        mine = llamacpp_report.goal_lines(rows) if llamacpp else goal_lines(rows)
        goals += [f"- *{name}*: {g.removeprefix('- ')}" if titled else g for g in mine]
    lines.pop()
    if goals:
        lines += ["", "## Against the goals", ""] + goals
    return lines


# --- summary ------------------------------------------------------------------------------

def summarize(report: dict) -> list[dict]:
    """One row per prompt set x method x setting, computed from the per-prompt records
    (report["specs"] is keyed by (prompt set, setting))."""
    rows = []
    for (prompt_set, setting), specs in report["specs"].items():
        here = [r for r in report["records"] if r["temperature"] == setting.temperature
                and r["top_p"] == setting.top_p
                and r.get("prompt_set", "humaneval") == prompt_set]
        by_method = {}
        for r in here:
            by_method.setdefault(r["method"], {})[r["prompt"]] = r
        for spec in specs:
            rows.append({"prompt_set": prompt_set, **_row(spec, setting, by_method)})
    return rows


def _by_source(records) -> dict:
    """Tokens per target forward split by who made them (pooled): the target's own token of
    each forward, and the drafted tokens it accepted, under their source ("model" or
    "ngram"); the share of steps a governor ran plain."""
    forwards = max(1, sum(r["target_forwards"] for r in records))
    kept = sum(r.get("draft_tokens_kept") or 0 for r in records)
    total = sum(r["new_tokens"] for r in records)
    split = {"target": (total - kept) / forwards}
    credited: dict[str, float] = {}
    for r in records:
        # a hybrid run tags each accepted token; scale its counts to draft_tokens_kept (the
        # last step's tokens beyond max_new_tokens are counted by the engine, not kept here)
        tagged = r.get("kept_by_source") or {}
        if tagged and sum(tagged.values()):
            scale = (r.get("draft_tokens_kept") or 0) / sum(tagged.values())
            for source, count in tagged.items():
                credited[source] = credited.get(source, 0.0) + count * scale
        elif r.get("draft_source") not in (None, "hybrid"):      # hybrid runs always tag
            source = r["draft_source"]
            credited[source] = credited.get(source, 0.0) + (r.get("draft_tokens_kept") or 0)
    for source in sorted(credited):
        split[source] = credited[source] / forwards
    plain = [r.get("governor_plain_steps") for r in records]
    share = (sum(plain) / forwards) if plain and all(x is not None for x in plain) else None
    return {"tokens_per_step_by_source": split, "governor_plain_share": share}


def _row(spec, setting, by_method) -> dict:
    mine = by_method[spec.method]
    decode = sum(r["decode_seconds"] for r in mine.values())
    matches = [r["greedy_matches_autoregressive"] for r in mine.values()
               if r["greedy_matches_autoregressive"] is not None]
    return {
        "method": spec.method, "config": spec.config, "temperature": setting.temperature,
        "top_p": setting.top_p, "prompts": len(mine),
        "tokens_per_second": statistics.median(r["tokens_per_second"] for r in mine.values()),
        "speedup_vs_autoregressive": _median_ratio(mine, by_method.get("autoregressive")),
        "speedup_vs_hf_generate": _median_ratio(mine, by_method.get("hf_generate")),
        "tokens_per_step": (sum(r["new_tokens"] for r in mine.values())
                            / max(1, sum(r["target_forwards"] for r in mine.values()))),
        "predicted_tokens_per_step": spec.predicted,
        "ms_per_token": 1000.0 * decode / max(1, sum(r["timed_tokens"] for r in mine.values())),
        "time_split": _time_split(mine.values()),
        "greedy_matches_autoregressive": all(matches) if matches else None,
        "chosen_by": spec.chosen_by, "acceptance_vector": spec.vector,
        "tree_parents": spec.tree.parents if spec.tree is not None else None,
        **_by_source(list(mine.values())),
        **_end_to_end(mine, by_method),
    }


def _end_to_end(mine: dict, by_method: dict) -> dict:
    """End-to-end (prefill included) figures: the median request time, the prefill, the
    ratios to plain llama.cpp on the same prompt (plain time / this method's time, so > 1 is
    faster; median and the worst prompt), engine overhead = time outside the model forwards
    over the decode time (pooled), and greedy agreement with plain llama.cpp."""
    walls = {i: r.get("end_to_end_seconds") for i, r in mine.items()}
    out = {"end_to_end_seconds": None, "prefill_seconds": statistics.median(
        r["prefill_seconds"] for r in mine.values()),
        "speedup_vs_plain_llamacpp": None, "speedup_vs_plain_llamacpp_min": None,
        "end_to_end_vs_autoregressive": None, "end_to_end_vs_autoregressive_min": None,
        "end_to_end_vs_hf_assisted": None, "end_to_end_vs_hf_assisted_min": None,
        "overhead_share": sum(r["other_seconds"] for r in mine.values())
        / max(1e-12, sum(r["decode_seconds"] for r in mine.values()))}
    if any(w is None for w in walls.values()):
        return out
    out["end_to_end_seconds"] = statistics.median(walls.values())
    for name, key in (("llamacpp_plain", "speedup_vs_plain_llamacpp"),
                      ("autoregressive", "end_to_end_vs_autoregressive"),
                      ("hf_assisted_default", "end_to_end_vs_hf_assisted")):
        base = by_method.get(name) or {}
        ratios = [base[i]["end_to_end_seconds"] / w for i, w in walls.items()
                  if i in base and base[i].get("end_to_end_seconds") and w > 0]
        if ratios:
            out[key] = statistics.median(ratios)
            out[key + "_min"] = min(ratios)
    if "llamacpp_plain" in by_method:
        same = [r.get("greedy_matches_plain_llamacpp") for r in mine.values()]
        same = [x for x in same if x is not None]
        out["greedy_matches_plain_llamacpp"] = all(same) if same else None
    return out


def _time_split(records) -> dict[str, float]:
    """Shares of target / draft / other in the pooled decode time. For transformers runs
    the parts come from hooks and an estimated prefill, so they are normalised by their sum
    (which differs from the decode wall time by the estimate's error)."""
    parts = {part: sum(r[f"{part}_seconds"] for r in records)
             for part in ("target", "draft", "other")}
    total = sum(parts.values())
    return {part: value / total if total > 0 else 0.0 for part, value in parts.items()}


def _median_ratio(mine: dict, base: dict | None) -> float | None:
    """Median over prompts of tokens/s(method) / tokens/s(base) on the same prompt."""
    if not base:
        return None
    ratios = [r["tokens_per_second"] / base[i]["tokens_per_second"] for i, r in mine.items()
              if i in base and base[i]["tokens_per_second"] > 0]
    return statistics.median(ratios) if ratios else None


# --- output -------------------------------------------------------------------------------

def write_outputs(report: dict, out_dir=None, date: str | None = None) -> dict[str, Path]:
    """Write <stem>.json, <stem>.raw.json, <stem>.md and the plots; return their paths."""
    config = report["config"]
    out = Path(out_dir or config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runtime = "-llamacpp" if getattr(config, "backend", "hf") == "llamacpp" else ""
    stem = config.stem or \
        f"{config.machine or machine_name()}{runtime}-{date or datetime.date.today().isoformat()}"
    summary = summarize(report)
    document = _document(report, summary, stem)
    paths = {"summary": out / f"{stem}.json", "raw": out / f"{stem}.raw.json",
             "markdown": out / f"{stem}.md"}
    atomic_write(paths["raw"], json.dumps({"format": 1, "kind": "bench-raw",
                                            "records": report["records"]}, indent=1))
    atomic_write(paths["summary"], json.dumps(document, indent=1, default=_json_default))
    if config.plots:
        paths.update(save_plots(document, out, stem))
    document["plots"] = {k: v.name for k, v in paths.items() if k.startswith("plot")}
    atomic_write(paths["summary"], json.dumps(document, indent=1, default=_json_default))
    atomic_write(paths["markdown"], markdown(document))
    return paths


def _document(report, summary, stem) -> dict:
    config, inputs, pair = report["config"], report["inputs"], report["pair"]
    vectors = [{"temperature": a.temperature, "top_p": a.top_p,
                "method": a.extra.get("method", "sequoia"), "steps": a.steps,
                "source": source, "p": [float(x) for x in a.p]} for a, source in inputs.vectors]
    return {
        "format": 1, "kind": "bench", "stem": stem, "machine": config.machine or machine_name(),
        "date": datetime.date.today().isoformat(), "command": config.command,
        "cpu": cpu_model(), "backend": getattr(config, "backend", "hf"),
        "runtime": report.get("runtime"),
        "models": pair.name, "elapsed_seconds": report["elapsed_seconds"],
        "config": {k: v for k, v in asdict(config).items() if k not in ("notes",)},
        "reductions": config.reductions(),
        "notes": (llamacpp_report.notes(config) if getattr(config, "backend", "hf") == "llamacpp"
                  else _notes(config)) + list(config.notes) + inputs.notes
                 + list(report.get("notes", [])),
        "profile": inputs.profile_source, "vectors": vectors,
        "selections": report["selections"], "raw": f"{stem}.raw.json",
        "prompt_sets": report.get("prompt_sets", {}),
        "load_average_1min": _load_summary(report.get("load_averages", [])),
        "summary": summary,
    }


def _load_summary(samples) -> dict:
    """The machine's 1-minute load average during the run (other work skews timings)."""
    return {"cores": cpu_cores(), "samples": [round(x, 2) for x in samples],
            "start": samples[0] if samples else None, "max": max(samples) if samples else None}


def _notes(config) -> list[str]:
    notes = ["decode-only columns exclude prefill: redwood methods time it separately (a "
             "speculative request's fused prompt pass counts as decode); for "
             "transformers generate it is estimated by a 1-token generate of the target on the "
             "same prompt (plus a 1-token generate of the draft for assisted generation), "
             "subtracted from the wall time, and the first token is not counted",
             "greedy (T = 0) ignores top_p, so T = 0 runs once, at the largest top_p",
             "EOS ignored by every method: redwood with stop_on_eos=False, transformers "
             "with no EOS ids in its generation config (it neither stops at EOS nor "
             "suppresses it, so greedy outputs stay comparable token for token; "
             "min_new_tokens would suppress EOS and change the distribution)",
             "speedups are medians over prompts of per-prompt ratios; tokens/step is pooled "
             "(all tokens / all target forwards)",
             "predicted tokens/step: the tree's expected length under the acceptance vector "
             "(positional model); for hf_assisted_constant the chain of k + 1 nodes"]
    if any(m in config.methods for m in HF_METHODS):
        notes.append("transformers time split from forward hooks on both models")
    return notes


def _json_default(value):
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")
