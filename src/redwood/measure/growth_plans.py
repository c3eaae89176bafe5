"""Per-step tree growth (decode/tree_growth.py) from a tuned bundle and this machine's profile:
the largest tree a step may grow into (per temperature), the growth rule on this machine's
costs, and the calibrated acceptance by draft probability the bundle recorded (confidence bins
of its acceptance files; older bundles have none and use c(q) = q)."""
from __future__ import annotations

import functools

from redwood.decode.governor import draft_level_ms
from redwood.decode.tree_growth import BestFirstGrowth, Calibration
from redwood.plan.formats import Acceptance, ConfidenceBins, Profile
from redwood.plan.planner import dp_table
from redwood.plan.tree import Tree

GROWTH_BUDGET, GROWTH_DEPTH, GROWTH_SPINE = 48, 12, 31


def growth_tree(p, profile: Profile) -> Tree:
    """The most a step may grow into, for acceptance vector p: the DP tree (depth <= 12) of
    the largest budget whose union with a rank-1 spine of GROWTH_SPINE levels stays within
    the largest measured size (<= 48 nodes; a first-use profile measures 40 and 48 for this).

    The DP tree is the best *fixed* shape for the average acceptance; the spine is there for
    the steps where the draft stays right for long (predictable code: transformers' assisted
    generation drafts up to 20 tokens there), which an average-acceptance tree never reaches.
    31 levels, not 21: replaying recorded HumanEval runs on the EPYC's costs
    (benchmarks/policy_ceiling.py), chains of at most 31 levels with rank-2 leaves where the
    draft hesitates took 3.1-3.3 % less decode time than the same at most 21 levels (chat:
    0-0.2 %).
    The growth rule decides per step how much of either to use."""
    largest = max(n for n in profile.target_ms if n <= GROWTH_BUDGET)
    spine = min(GROWTH_SPINE, largest)
    table = dp_table(p, largest, GROWTH_DEPTH)
    for budget in range(largest, 0, -1):
        depth = max(d for d in range(1, table.max_depth + 1) if table.feasible(budget, d))
        tree = with_spine(table.tree(budget, depth), spine)
        if len(tree) <= largest:
            break
    tree.source.update({"kind": "growth limit", "dp_budget": budget, "spine_levels": spine})
    return tree


def with_spine(tree: Tree, levels: int) -> Tree:
    """`tree` with its rank-1 chain from the root extended to `levels` levels (root = 1)."""
    paths = set(tree.paths())
    paths.update((0,) * k for k in range(1, levels))
    return Tree.from_paths(sorted(paths), source=dict(tree.source))


PLAIN = Tree([-1], {"kind": "plain", "why": "no tree of the bundle's vector pays on this machine"})


def growth_trees(profile: Profile, bundle):
    """temperature -> growth_tree for the bundle's vector at the nearest temperature, or the
    root alone (plain decoding, no draft at all) where the planner finds that no tree of that
    vector beats plain decoding on this machine. Growing there would still keep the draft warm
    (its prefill, and a catch-up at every probe) for trees that rarely pay: on llama.cpp on a
    2-core EPYC that cost 22-24 % against plain decoding."""
    from redwood.measure.machine_profile import replan

    @functools.lru_cache(maxsize=None)
    def tree_at(entry_temperature: float) -> Tree:
        entry = bundle.entry(entry_temperature)
        if len(replan(bundle, entry_temperature, profile, draft_confidence=0)[0]) == 1:
            return Tree(PLAIN.parents, dict(PLAIN.source, bundle_temperature=entry.temperature))
        tree = growth_tree(Acceptance.load(bundle.directory / entry.acceptance).p, profile)
        tree.source.update({"bundle": str(bundle.directory),
                            "bundle_temperature": entry.temperature})
        return tree

    return lambda temperature: tree_at(bundle.entry(temperature).temperature)


def per_entry(bundle, derive):
    """temperature -> derive(the Acceptance of the bundle entry nearest it), computed once per
    entry (a growth rule asks at the start of every step)."""
    @functools.lru_cache(maxsize=None)
    def at(entry_temperature: float):
        entry = bundle.entry(entry_temperature)
        return derive(Acceptance.load(bundle.directory / entry.acceptance))

    return lambda temperature: at(bundle.entry(temperature).temperature)


def calibration_of(acceptance: Acceptance) -> Calibration:
    """The entry's confidence bins as a Calibration (c(q) = q for files without bins)."""
    bins = ConfidenceBins.of(acceptance)
    return Calibration() if bins is None else Calibration.from_bins(bins)


def calibrations(bundle):
    """temperature -> Calibration from the bundle entry's confidence bins (or c(q) = q)."""
    return per_entry(bundle, calibration_of)


def continuations(bundle):
    """temperature -> p[0] of the bundle entry's acceptance vector: how often the target kept
    a rank-1 draft token whose parent it kept (BestFirstGrowth's `continuation`)."""
    return per_entry(bundle, lambda acceptance: float(acceptance.p[0]))


def growth_rule(profile: Profile, bundle=None) -> BestFirstGrowth:
    """The growth rule on this machine's costs; its calibration and continuation follow each
    request's temperature (BestFirstGrowth.begin)."""
    if bundle is None:
        return BestFirstGrowth(profile.target_ms, functools.partial(draft_level_ms, profile))
    return BestFirstGrowth(profile.target_ms, functools.partial(draft_level_ms, profile),
                           calibrations(bundle), continuations(bundle))
