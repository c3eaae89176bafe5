"""The draft model's side of a hybrid drafter (decode/hybrid_drafter.py), per temperature:
the tuned bundle's acceptance vector planned against this machine's profile, keeping the best
tree that drafts (even when plain decoding beats it on its own: the hybrid weighs it step by
step against free n-gram drafts and plain steps, from what it actually yields)."""
from __future__ import annotations

import functools

from redwood.plan.formats import Acceptance, Profile, sample_acceptance_path
from redwood.plan.planner import best_speculative, choose_tree
from redwood.plan.tree import Tree


def hybrid_plans(profile: Profile, bundle=None, tree: Tree | None = None, auto: bool = False,
                 bundle_latencies: bool = False):
    """temperature -> (model tree, expected tokens per step, mode).

    auto (`--drafter auto`, needs a bundle): per temperature, mode "ngram" (free drafts only)
    where the planner finds no model tree faster than plain decoding on this machine, else
    "hybrid"; otherwise always "hybrid". bundle_latencies: the mode the bundle recorded for
    the machine it was tuned on (its entry's `drafter`) instead of this machine's plan.

    With a bundle: its entry nearest the temperature, planned for `profile` within the
    bundle's budget and depth limits. Without: the given tree (or the default tree), its
    expectation from the shipped sample acceptance vector (only a prior: the live rate takes
    over after a few steps)."""
    if bundle is None:
        from redwood.plan.tree import default_tree

        tree = tree if tree is not None else default_tree()
        expected = tree.expected_length(Acceptance.load(sample_acceptance_path()).p)
        return lambda temperature: (tree, max(1.0, expected), "hybrid")

    settings = bundle.index.get("settings", {})
    max_budget = min(int(settings.get("max_budget", 32)), max(profile.target_ms))
    max_depth = int(settings.get("max_depth", 16))

    @functools.lru_cache(maxsize=None)
    def plan(entry_temperature: float):
        entry = bundle.entry(entry_temperature)
        acceptance = Acceptance.load(bundle.directory / entry.acceptance)
        choice = choose_tree(acceptance, profile, max_budget, max_depth)
        model_tree, expected = best_speculative(choice)
        model_tree.source.update({"bundle": str(bundle.directory),
                                  "bundle_temperature": entry.temperature})
        here = entry.drafter if bundle_latencies else ("ngram" if choice.budget == 1 else "hybrid")
        mode = here if auto else "hybrid"
        return model_tree, max(1.0, float(expected)), mode

    return lambda temperature: plan(bundle.entry(temperature).temperature)
