"""summary.md of a tuned bundle: what was measured, what the planner chose, and why."""
from __future__ import annotations

PROFILE_ROWS = 16          # sizes 1..16 in full, then the rest in one line


def bundle_summary(index: dict, chosen, variants) -> str:
    lines = [f"# Tuned bundle `{index['name']}`", ""]
    lines += _provenance(index)
    lines += ["", "## Chosen trees", ""] + _choice_table(chosen)
    lines += ["", "Predicted speedup = expected tokens per step x t_target(1) / (t_target(n) + "
              "draft time of the tree's levels), from the measured profile and vectors below; "
              "a prediction, not a benchmark (`redwood bench` measures)."]
    lines += _shape_note(list(chosen.choices.values()))
    if chosen.adaptive:
        lines += ["", "## Adaptive trees", ""] + adaptive_table(chosen.adaptive)
    if len(variants) > 1:
        lines += ["", "## Draft variants compared", ""] + _variant_table(chosen, variants)
    lines += ["", "## Latency profile", "", f"Device: {chosen.profile.device}; context "
              f"{chosen.profile.context} tokens; medians of {index['settings']['repeats']} rounds "
              f"after {index['settings']['warmup']} warm-up rounds.", ""]
    lines += _profile_table(chosen.profile)
    lines += ["", "![latency profile](profile.png)", "", "## Acceptance vectors", ""]
    lines += _acceptance_table(variants)
    lines += ["", "![acceptance vectors](acceptance.png)", ""]
    for temperature in chosen.choices:
        tag = f"{float(temperature):g}"
        lines += [f"![tree for T = {tag}](tree-{tag}.png)", ""]
    return "\n".join(lines)


def _shape_note(choices) -> list[str]:
    """Say so when the hardware-aware answer is a chain (or no speculation at all)."""
    if all(c.budget == 1 for c in choices):
        return ["", "On this machine no tree is predicted to beat plain decoding: the draft and "
                "the verification of even one extra token cost more than they gain."]
    if all(c.tree.max_width <= 1 for c in choices):
        return ["", "On this machine the planner's best trees are chains: verifying a wider tree "
                "costs more target time than the extra accepted tokens repay (the "
                "hardware-aware answer)."]
    return []


def _provenance(index: dict) -> list[str]:
    s = index["settings"]
    return [
        f"- made by: `{index['command']}`" if index["command"] else "- made by: `redwood.measure.tune.tune`",
        f"- took {_duration(index['seconds'])} on {index['device']}, {index['created']}, "
        f"redwood {index['redwood']}",
        f"- target: {index['target'] or '?'} ({index['dtype']}"
        + (", --fast-linear" if index.get("fast_linear") else "") + ")",
        f"- draft: {index['draft'] or '?'} ({index['draft_dtype']}"
        + (f", --draft-quantize {index['draft_quantize']}" if index["draft_quantize"] else "") + ")",
        f"- calibration: {index['dataset'] or 'given prompts'}; {index['prompts']} prompts x "
        f"up to {s['max_new_tokens']} new tokens, star of width {s['width']}, method "
        f"{s['method']}, top_p {s['top_p']}, top_k {s['top_k'] or 'off'}, seed {s['seed']}",
        f"- planner: budgets 1..{s['max_budget']} (every measured size), at most "
        f"{s['max_depth']} levels",
    ]


def _choice_table(variant) -> list[str]:
    rows = ["| temperature | budget n | levels d | nodes per level | tokens/step (predicted) "
            "| step ms | predicted speedup |", "|---|---|---|---|---|---|---|"]
    for temperature, c in variant.choices.items():
        rows.append(f"| {temperature:g} | {c.budget} | {c.depth} | {c.tree.level_sizes} | "
                    f"{c.tokens_per_step:.3f} | {c.step_ms:.1f} | {c.speedup:.3f}x |")
    return rows


def adaptive_table(plans: dict) -> list[str]:
    """The adaptive section's text and table; plans: temperature -> adaptive.AdaptivePlan."""
    rows = ["`--tree auto` drafts these deeper trees, pruned as it goes: a node gets draft "
            "children only while the draft gave every token on its path a probability of at "
            "least the threshold, so the tree follows how predictable the text is. Threshold = the cost of "
            "one more drafted token (one draft level plus the target's mean cost per extra row) "
            "over the time a token costs with the static tree above (`redwood.plan.adaptive`), "
            "unless `redwood tune --draft-confidence C` gave a measured value. "
            "`--draft-confidence 0` uses the static tree instead.", "",
            "| temperature | max tree (nodes, levels) | threshold used | estimated | marginal ms "
            "| ms per token |", "|---|---|---|---|---|---|"]
    for temperature, plan in plans.items():
        rows.append(f"| {temperature:g} | {len(plan.tree)}, {plan.tree.num_levels} | "
                    f"{plan.draft_confidence:.3f} | {plan.estimated_confidence:.3f} | "
                    f"{plan.marginal_ms:.1f} | {plan.ms_per_token:.1f} |")
    return rows


def _variant_table(chosen, variants) -> list[str]:
    temps = list(chosen.choices)
    head = "| draft | " + " | ".join(f"T = {t:g}: n, d, speedup" for t in temps) + " | mean |"
    rows = [head, "|---" * (len(temps) + 2) + "|"]
    for v in variants:
        cells = [f"{v.choices[t].budget}, {v.choices[t].depth}, {v.choices[t].speedup:.3f}x"
                 for t in temps]
        mark = " (chosen)" if v is chosen else ""
        rows.append(f"| {v.name}{mark} | " + " | ".join(cells) + f" | {v.mean_speedup:.3f}x |")
    return rows


def _profile_table(profile) -> list[str]:
    sizes = sorted(set(profile.target_ms) | set(profile.draft_ms))
    rows = ["| n | target ms (tree of n) | draft ms (level of n) |", "|---|---|---|"]
    for n in sizes[:PROFILE_ROWS]:
        rows.append(f"| {n} | {_ms(profile.target_ms.get(n))} | {_ms(profile.draft_ms.get(n))} |")
    rest = sizes[PROFILE_ROWS:]
    if rest:
        rows += ["", "Larger sizes, target ms: " + ", ".join(
            f"{n}: {profile.target_ms[n]:.1f}" for n in rest if n in profile.target_ms)]
        rows += ["Larger widths, draft ms: " + ", ".join(
            f"{n}: {profile.draft_ms[n]:.1f}" for n in rest if n in profile.draft_ms)]
    return rows


def _acceptance_table(variants) -> list[str]:
    ranks = 8
    head = ("| draft | T | " + " | ".join(f"p{k}" for k in range(1, ranks + 1))
            + " | sum | steps |")
    rows = [head, "|---" * (ranks + 4) + "|"]
    for v in variants:
        for t, a in v.acceptances.items():
            ps = [f"{x:.4f}" for x in a.p[:ranks]] + [""] * max(0, ranks - len(a.p))
            rows.append(f"| {v.name} | {t:g} | " + " | ".join(ps)
                        + f" | {a.p.sum():.4f} | {a.steps} |")
    return rows


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _ms(value) -> str:
    return "" if value is None else f"{value:.1f}"
