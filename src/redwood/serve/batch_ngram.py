"""Prompt-lookup drafting in the batch (`redwood serve --drafter ngram`, batched).

Each live request gets its own `NgramDrafter` (decode/ngram_drafter.py) over its prompt and
its text so far, sharing one `NgramMemory` of earlier answers when the server has one. Every
step, every ready request's drafter proposes the part of its trie that maximises E(n) / t(n)
on this machine's costs at the request's context (n = 1: a plain step), exactly as the
single-request engine's does; the proposals are point masses, so the engine's verifiers stay
exact (docs/design.md §4.5). No draft model runs.

Costs: each request's drafter reads a `LiveCosts` (plan/live_costs.py) built from the
machine's profile at its context. A step in which the request decoded alone, with no prompt
chunk in the decode, is what the profile predicts for its tree size, so its target decode time
corrects that request's costs; steps shared with other requests are not attributed (a tree's
marginal cost inside a larger decode is not t(n)), and then each request's tree is sized as if
it ran alone, the whole step bounded by n_batch.
"""
from __future__ import annotations

import torch

from redwood.decode.layout import TreeLayout
from redwood.decode.ngram_drafter import COPY_DEPTH, NgramDrafter, ngram_budget_tree
from redwood.plan.batch_planner import ROOT_ONLY
from redwood.plan.live_costs import LiveCosts
from redwood.plan.tree import chain


class BatchNgramDrafting:
    """What every request's n-gram drafter is made from: the machine's profile (plan.formats.
    Profile, llama.cpp's by-context table), the acceptance model's priors (a factory, so each
    request learns its own), an optional shared memory, and the budget tree whose limits
    bound every proposal (its node count is what a request reserves beyond its text)."""

    def __init__(self, profile, model_factory, memory=None, depth: int = COPY_DEPTH):
        self.profile, self.model_factory, self.memory = profile, model_factory, memory
        self.budget = TreeLayout.build(ngram_budget_tree(depth=depth), "cpu")
        self.chain = TreeLayout.build(chain(depth), "cpu")     # the `chain` method's limits

    def limits(self, method: str) -> TreeLayout:
        """The tree a request's proposals must fit: one chain for the chain method (the
        engine's rule), else the budget tree."""
        return self.chain if method == "chain" else self.budget

    @property
    def max_nodes(self) -> int:
        return len(self.budget.tree)

    def start(self, prompt: list[int], use_memory: bool) -> NgramDrafter:
        """A drafter for a new request holding `prompt` (the tokens before its first root),
        its costs from the profile at that context."""
        profile = self.profile
        drafter = NgramDrafter(target_ms=profile.target_ms,
                               target_ms_by_context=profile.target_ms_by_context,
                               model=self.model_factory(), max_length=self.budget.tree.num_levels,
                               memory=self.memory)
        drafter.costs = LiveCosts.for_request(profile, len(prompt))
        drafter.use_memory = bool(use_memory)
        drafter.prefill(torch.tensor(prompt, dtype=torch.long))
        return drafter


def propose(scheduler, work: list) -> None:
    """Give every ready n-gram request this step's proposal (w.tree, w.tokens, w.point_mass);
    a request whose drafter proposes nothing, or whose tree would not fit the decode, keeps the
    root alone. Called after the planner (which plans no trees without a draft model)."""
    drafting = scheduler.ngram
    room = scheduler.target.n_batch
    for i, w in enumerate(work):
        drafter = w.live.ngram
        if drafter is None:
            room -= len(w.tree)
            continue
        drafter.costs.follow(len(w.live.request.prompt) + len(w.live.request.tokens))
        proposal = drafter.propose(w.live.root, drafting.limits(w.live.request.method),
                                   w.live.chooser)
        size = len(proposal.layout.tree)
        if 1 < size <= room - (len(work) - i - 1):      # a root's row for every later request
            w.tree, w.tokens, w.point_mass = proposal.layout.tree, proposal.tokens, \
                proposal.point_mass
            w.expected_tokens = proposal.expected_tokens
        else:                                   # nothing worth drafting, or no room left
            if size > 1:
                drafter.withdraw()
            w.tree = ROOT_ONLY
        w.proposed = True
        room -= len(w.tree)


def undo(work: list) -> None:
    """A failed step: close the open proposals, none of them verified. (The root each
    proposal appended stays in its index, so the retried step's text there holds it twice:
    later lookups may match less well, proposals stay point masses fixed before verification.)"""
    for w in work:
        if w.live.ngram is not None and w.proposed:
            w.live.ngram.withdraw()
            w.live.ngram.commit_tokens([])
            w.proposed = False


def commit(w, root: int) -> None:
    """After verification: tell the request's drafter what the target kept. `root`: the
    token the step ran at its root (the request's root before the step's tokens)."""
    drafter = w.live.ngram
    if drafter is None:
        return
    if w.proposed:
        # accepted drafted tokens (none after a plain step: its proposal was dropped)
        drafter.commit_tokens([int(w.tokens[u]) for u in w.path[1:]] if w.speculative else [])
        if w.speculative and w.expected_tokens is not None:   # its prediction against the kept
            w.live.request.prediction.record_prediction(w.expected_tokens, len(w.path))
    else:
        drafter.skip(root)                      # a plain step no lookup ran for (first token)


def record_cost(work: list, seconds: float) -> None:
    """A step whose decode carried one request's tree alone and nothing else: its time
    corrects that request's costs for that tree size."""
    if len(work) == 1 and work[0].live.ngram is not None:
        work[0].live.ngram.costs.record_target(len(work[0].tree), seconds)


def finish(live, reason: str) -> None:
    """The request left: a finished answer goes to the memory (decode/ngram_memory.py), a
    cancelled or failed one does not."""
    if live.ngram is not None:
        if reason not in ("eos", "length", "stopped"):
            live.ngram.use_memory = False
        live.ngram.finish()
        live.request.match_counts = {k: list(v) for k, v in live.ngram.match_counts.items()}
