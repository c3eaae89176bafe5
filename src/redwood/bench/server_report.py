"""Ratios to plain llama-server from a server benchmark's records (bench.server_bench), and the
markdown table.

Per prompt and method: the minimum and the median of its end-to-end times over the rounds.
The ratio on a prompt is plain llama-server's end-to-end time over the method's, from the
minima (the primary figure: each method at its least disturbed) and from the medians. When the
answers have the same length (greedy with identical outputs) that is the plain time ratio. When
they differ (T > 0; a greedy near-tie resolved another way), the baseline's time is carried to
the method's length with its own decode cost per token (llama-server's `timings`:
predicted_ms / predicted_n), so neither side gains from a longer answer spreading its prefill
over more tokens; a baseline without timings falls back to the ratio of end-to-end rates
(tokens / wall time). A method whose answers differ in length between rounds (T > 0) is taken
at its best round by that carried ratio, not at its shortest wall time: a fast round with a short
answer is not its least disturbed one (chat-1 at T 0.6 read 0.83x from a 177-token round at 43 ms
a token while its 202-token rounds ran at 38-39). Over a set: the median over prompts and the
worst prompt. A round whose baseline rate strays more than STRAY from the baseline's median
over rounds (on the median prompt) is flagged: the machine was busy then.
"""
from __future__ import annotations

import statistics
from collections import defaultdict

from redwood.bench.server_specs import BASELINE, METHODS

STRAY = 0.10


def _by(records, *keys):
    groups = defaultdict(list)
    for r in records:
        groups[tuple(getattr(r, k) for k in keys)].append(r)
    return groups


def per_prompt(records) -> dict:
    """{(set, T, prompt, method): {"min_wall", "median_wall", "tokens" (of the fastest round),
    "median_tokens", "decode_s_per_token" (from server timings, or None), "rate_min"
    (the fastest round's tokens per second), "round_walls": [(wall, tokens) per round]}}."""
    out = {}
    for key, group in _by(records, "prompt_set", "temperature", "prompt", "method").items():
        walls = sorted(r.wall_seconds for r in group)
        best = min(group, key=lambda r: r.wall_seconds)
        tokens = statistics.median(r.completion_tokens for r in group)
        out[key] = {"min_wall": walls[0], "median_wall": statistics.median(walls),
                    "tokens": best.completion_tokens, "median_tokens": tokens,
                    "rounds": len(group), "decode_s_per_token": _decode_cost(best),
                    "round_walls": [(r.wall_seconds, r.completion_tokens) for r in group],
                    "rate_min": best.completion_tokens / best.wall_seconds}
    return out


def _decode_cost(record) -> float | None:
    """Seconds per generated token in decoding, from llama-server's timings."""
    timings = record.extra.get("timings") or {}
    n, ms = timings.get("predicted_n"), timings.get("predicted_ms")
    return ms / 1000.0 / n if n and ms else None


def prompt_ratio(base: dict, cell: dict, which: str) -> float:
    """Baseline time over the method's on one prompt (module doc); which: "min" or "median".
    "min" takes the method's best round by that ratio (the fastest round when every round's
    answer has the same length)."""
    if which == "min" and cell.get("round_walls"):
        return max(_ratio(base, "min_wall", "tokens", wall, tokens)
                   for wall, tokens in cell["round_walls"])
    wall, tokens = (("min_wall", "tokens") if which == "min" else ("median_wall", "median_tokens"))
    return _ratio(base, wall, tokens, cell[wall], cell[tokens])


def _ratio(base: dict, base_wall: str, base_tokens: str, wall: float, tokens) -> float:
    """The baseline's time (its `base_wall` at `base_tokens`) carried to `tokens` at its decode
    cost per token, over the method's `wall`; without that cost, the ratio of rates."""
    if tokens == base[base_tokens]:
        return base[base_wall] / wall
    per_token = base["decode_s_per_token"]
    if per_token is None:
        return (tokens / wall) / (base[base_tokens] / base[base_wall])
    carried = base[base_wall] + (tokens - base[base_tokens]) * per_token
    return max(carried, 1e-9) / wall


def ratios(records, baseline: str = BASELINE) -> dict:
    """{(set, T, method): {"min": {"median", "worst", "per_prompt"}, "median": {...},
    "identical": k of n (T = 0), "tokens_per_s", ...}} against `baseline`."""
    cells, texts = per_prompt(records), _texts(records)
    summary = {}
    for (prompt_set, t, prompt, method), cell in cells.items():
        base = cells.get((prompt_set, t, prompt, baseline))
        if base is None:
            continue
        entry = summary.setdefault((prompt_set, t, method), {"min": [], "median": [],
                                                             "identical": 0, "prompts": 0,
                                                             "rates": [], "tokens": []})
        entry["min"].append(prompt_ratio(base, cell, "min"))
        entry["median"].append(prompt_ratio(base, cell, "median"))
        entry["rates"].append(cell["rate_min"])
        entry["tokens"].append(cell["tokens"])
        entry["prompts"] += 1
        if texts.get((prompt_set, t, prompt, method)) == texts.get((prompt_set, t, prompt, baseline)):
            entry["identical"] += 1
    for entry in summary.values():
        for kind in ("min", "median"):
            values = entry[kind]
            entry[kind] = {"median": statistics.median(values), "worst": min(values),
                           "per_prompt": values}
        entry["tokens_per_s"] = statistics.median(entry.pop("rates"))
        entry["median_tokens"] = statistics.median(entry.pop("tokens"))
    return summary


def _texts(records) -> dict:
    """The first round's text per (set, T, prompt, method): greedy outputs should agree."""
    out = {}
    for r in records:
        if r.round == 0:
            out[(r.prompt_set, r.temperature, r.prompt, r.method)] = r.text
    return out


def stray_rounds(records, baseline: str = BASELINE) -> list[dict]:
    """Rounds whose baseline rate (median over its prompts) is more than STRAY from the median
    over rounds."""
    rates = {}
    for (rnd,), group in _by([r for r in records if r.method == baseline], "round").items():
        rates[rnd] = statistics.median(r.completion_tokens / r.wall_seconds for r in group)
    if len(rates) < 2:
        return []
    middle = statistics.median(rates.values())
    return [{"round": rnd, "baseline_tokens_per_s": rate, "median_tokens_per_s": middle}
            for rnd, rate in sorted(rates.items()) if abs(rate / middle - 1.0) > STRAY]


def speculation_figures(records) -> dict:
    """{set: {method: figures}} pooled over a set's requests from what the servers report:
    llama-server's timings (draft_n, draft_n_accepted -> "draft_acceptance") and redwood's
    stats: "tokens_per_forward" (tokens over target forwards), "predicted_tokens_per_step" and
    "observed_tokens_per_step" (the drafter's E(n) against what the target kept, over the
    steps it predicted) and "acceptance_by_match" {match length: [accepted, proposed]}."""
    out = {}
    for (prompt_set, method), group in _by(records, "prompt_set", "method").items():
        figures = _pooled_figures(group)
        if figures:
            out.setdefault(prompt_set, {})[method] = figures
    return out


def _pooled_figures(group) -> dict:
    drafted = accepted = forwards = tokens = steps = 0
    predicted = observed = 0.0
    by_match: dict[str, list[int]] = {}
    for r in group:
        timings = r.extra.get("timings") or {}
        drafted += int(timings.get("draft_n") or 0)
        accepted += int(timings.get("draft_n_accepted") or 0)
        stats = r.extra.get("redwood") or {}
        if stats.get("target_forwards"):
            forwards += stats["target_forwards"]
            tokens += stats["tokens_per_target_forward"] * stats["target_forwards"]
        check = stats.get("predicted_vs_observed") or {}
        if check.get("steps"):
            steps += check["steps"]
            predicted += check["predicted_tokens_per_step"] * check["steps"]
            observed += check["observed_tokens_per_step"] * check["steps"]
        for label, (kept, proposed) in (stats.get("acceptance_by_match") or {}).items():
            counts = by_match.setdefault(label, [0, 0])
            counts[0], counts[1] = counts[0] + kept, counts[1] + proposed
    figures = {}
    if drafted:
        figures["draft_acceptance"] = accepted / drafted
    if forwards:
        figures["tokens_per_forward"] = tokens / forwards
    if steps:
        figures.update(predicted_tokens_per_step=predicted / steps,
                       observed_tokens_per_step=observed / steps, predicted_steps=steps)
    if by_match:
        figures["acceptance_by_match"] = by_match
    return figures


def speculation_table(figures: dict, labels) -> str:
    """Markdown: one row per (set, method) with speculation figures; labels: the match-length
    buckets in order (decode.ngram_acceptance.MATCH_LABELS)."""
    lines = ["| set | method | tokens / target forward | predicted / observed tokens per step "
             "| draft acceptance | n-gram drafts kept by match length (" + ", ".join(labels)
             + ") |", "|---|---|---|---|---|---|"]
    for prompt_set, methods in figures.items():
        for method, f in methods.items():
            check = (f"{f['predicted_tokens_per_step']:.2f} / {f['observed_tokens_per_step']:.2f}"
                     if "predicted_steps" in f else "-")
            matches = f.get("acceptance_by_match") or {}
            by_match = ", ".join(
                f"{matches[k][0] / matches[k][1]:.2f} ({matches[k][1]})" if k in matches else "-"
                for k in labels) if matches else "-"
            per_forward = f"{f['tokens_per_forward']:.2f}" if "tokens_per_forward" in f else "-"
            drafts = f"{f['draft_acceptance']:.2f}" if "draft_acceptance" in f else "-"
            lines.append(f"| {prompt_set} | {method} | {per_forward} | {check} | {drafts} | "
                         f"{by_match} |")
    return "\n".join(lines)


def markdown_table(summary: dict, methods: list[str], sets: list[str], temperatures) -> str:
    """One row per method, one column per set; cells 'median (worst)' of the per-prompt ratios
    from the minima over rounds, one per temperature (T0 / T0.6 ...)."""
    lines = ["| method | " + " | ".join(sets) + " |", "|---|" + "---|" * len(sets)]
    for method in methods:
        cells = []
        for s in sets:
            parts = []
            for t in temperatures:
                entry = summary.get((s, t, method))
                parts.append("-" if entry is None else
                             f"{entry['min']['median']:.2f} ({entry['min']['worst']:.2f})")
            cells.append(" / ".join(parts))
        label = METHODS[method].description if method in METHODS else method
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


AGAIN = "llama-server-again"


def noise_floor(summary: dict) -> str | None:
    """A line on the A/A control (a second plain llama-server), None without it: the spread
    of its per-prompt ratios is what this run cannot tell apart from 1.00."""
    entries = [(s, t, e) for (s, t, m), e in sorted(summary.items()) if m == AGAIN]
    if not entries:
        return None
    cells = ", ".join(f"{s} T {t:g}: {e['min']['median']:.2f} ({e['min']['worst']:.2f}, best "
                      f"{max(e['min']['per_prompt']):.2f})" for s, t, e in entries)
    low = min(e["min"]["worst"] for _, _, e in entries)
    high = max(max(e["min"]["per_prompt"]) for _, _, e in entries)
    return (f"A/A noise floor: a second plain llama-server, timed like every method, measured "
            f"{cells} (median (worst, best) prompt). Per-prompt ratios of {low:.2f}-{high:.2f} "
            "are what this run measures for two identical servers.")

