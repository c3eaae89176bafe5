"""Add adaptive trees to a bundle made before `redwood tune` planned them, from the bundle's
own stored profile and acceptance vectors (no model is loaded, nothing is re-measured).

    python scripts/add_adaptive.py src/redwood/data/bundles/qwen2.5-coder-cpu [--draft-confidence C]

Exactly what `redwood tune` now writes: choose_tree is rerun on the stored files (it must give
the stored tree back), then redwood.plan.adaptive.plan_adaptive; the entry gains an "adaptive"
record, adaptive-<T>.json is written and summary.md gets the adaptive section.
"""
from __future__ import annotations

import json
from pathlib import Path

from redwood.plan.adaptive import plan_adaptive
from redwood.plan.formats import load_acceptance, load_profile
from redwood.plan.planner import choose_tree
from redwood.measure.bundles import BUNDLE_INDEX
from redwood.plan.tree import Tree
from redwood.measure.tune import adaptive_entry, temperature_tag
from redwood.measure.tune_summary import adaptive_table


def main(directory: str, draft_confidence: float | None = None) -> None:
    directory = Path(directory)
    index = json.loads((directory / BUNDLE_INDEX).read_text())
    settings = index["settings"]
    profile = load_profile(directory / index["profile"])
    plans = {}                                          # temperature -> AdaptivePlan
    for entry in index["trees"]:
        acceptance = load_acceptance(directory / entry["acceptance"])
        choice = choose_tree(acceptance.p, profile, settings["max_budget"], settings["max_depth"])
        if choice.tree != Tree.load(directory / entry["tree"]):
            raise SystemExit(f"{entry['tree']}: choose_tree no longer gives the stored tree")
        plan = plan_adaptive(acceptance.p, profile, choice, settings["max_budget"],
                             settings["max_depth"], draft_confidence)
        name = f"adaptive-{temperature_tag(entry['temperature'])}.json"
        plan.tree.save(directory / name, acceptance.p)
        entry["adaptive"] = adaptive_entry(plan, name)
        plans[entry["temperature"]] = plan
    (directory / BUNDLE_INDEX).write_text(json.dumps(index, indent=1) + "\n")
    summary = (directory / "summary.md").read_text()
    marker = "## Latency profile"
    if "## Adaptive trees" in summary:                  # replace the old section
        start = summary.index("## Adaptive trees")
        summary = summary[:start] + summary[summary.index(marker):]
    section = "\n".join(["## Adaptive trees", ""] + adaptive_table(plans) + ["", ""])
    (directory / "summary.md").write_text(summary.replace(marker, section + marker, 1))
    for t, plan in plans.items():
        print(f"T={t:g}: {len(plan.tree)} nodes, {plan.tree.num_levels} levels, "
              f"threshold {plan.draft_confidence:.3f} (marginal {plan.marginal_ms:.1f} ms, "
              f"{plan.ms_per_token:.1f} ms per token)")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--draft-confidence", type=float, default=None,
                        help="a measured threshold instead of redwood.plan.adaptive's estimate")
    args = parser.parse_args()
    main(args.bundle, args.draft_confidence)
