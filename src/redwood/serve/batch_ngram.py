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
marginal cost inside a larger decode is not t(n)). Requests that decode together have their
trees sized jointly on the profile's t(total tokens) (plan/joint_sizes.py): a drafted node
makes every request in the step wait, so it must pay for all of them.
"""
from __future__ import annotations

import torch

from redwood.decode.layout import TreeLayout
from redwood.decode.ngram_drafter import COPY_DEPTH, DRAFT_MARGIN, NgramDrafter
from redwood.decode.ngram_trees import ngram_budget_tree, tree_limits
from redwood.plan.batch_planner import ROOT_ONLY
from redwood.plan.joint_sizes import joint_sizes
from redwood.plan.live_costs import CONTEXT_BUCKET, LiveCosts, measured_ms
from redwood.plan.tree import chain


class BatchNgramDrafting:
    """What every request's n-gram drafter is made from: the machine's profile (plan.formats.
    Profile, llama.cpp's by-context table), one acceptance model (made by `model_factory`
    from the bundle's priors) that every request reads and teaches, an optional shared
    memory, and the budget tree whose limits bound every proposal (its node count is what a
    request reserves beyond its text).

    Why one model for the server: the priors are calibrated on edits, where a 4-7-token match
    usually goes on copying; on chat at T = 0.6 it does far less often. A model per request
    relearnt that in every request, and long-match keys are rare within one answer, so every
    request drafted on the edit priors for its rare long matches (predictions read 13-20 %
    above what the target kept). The single-request engine keeps its drafter's model across
    requests in the same way; the verifiers stay exact (only past outcomes shape a tree)."""

    def __init__(self, profile, model_factory, memory=None, depth: int = COPY_DEPTH):
        self.profile, self.memory = profile, memory
        self.model = model_factory()
        self.budget = TreeLayout.build(ngram_budget_tree(depth=depth), "cpu")
        self.chain = TreeLayout.build(chain(depth), "cpu")     # the `chain` method's limits
        self._limits = {id(t): tree_limits(t.tree) for t in (self.budget, self.chain)}
        self._table: tuple[int, dict[int, float]] | None = None   # (cells bucket, its t(n))

    def limits(self, method: str) -> tuple[TreeLayout, tuple[int, int, int]]:
        """The tree a request's proposals must fit (one chain for the chain method, the
        engine's rule; else the budget tree) and its (nodes, leaves, depth)."""
        layout = self.chain if method == "chain" else self.budget
        return layout, self._limits[id(layout)]

    @property
    def max_nodes(self) -> int:
        return len(self.budget.tree)

    def step_ms_at(self, cells: int) -> dict[int, float]:
        """The profile's {n: ms} for a shared decode while the lanes hold `cells` KV cells in
        all (one unified cache: every forward attends over the cells in use), re-read per
        CONTEXT_BUCKET."""
        bucket = int(cells) // CONTEXT_BUCKET
        if self._table is None or self._table[0] != bucket:
            self._table = (bucket, self.profile.target_ms_at(bucket * CONTEXT_BUCKET))
        return self._table[1]

    def start(self, prompt: list[int], use_memory: bool) -> NgramDrafter:
        """A drafter for a new request holding `prompt` (the tokens before its first root),
        its costs from the profile at that context."""
        profile = self.profile
        drafter = NgramDrafter(target_ms=profile.target_ms,
                               target_ms_by_context=profile.target_ms_by_context,
                               model=self.model, max_length=self.budget.tree.num_levels,
                               memory=self.memory)
        drafter.costs = LiveCosts.for_request(profile, len(prompt))
        drafter.use_memory = bool(use_memory)
        drafter.prefill(torch.tensor(prompt, dtype=torch.long))
        return drafter


def propose(scheduler, work: list) -> None:
    """Give every ready n-gram request this step's proposal (w.tree, w.tokens, w.point_mass);
    a request whose drafter proposes nothing keeps the root alone. Called after the planner
    (which plans no trees without a draft model).

    One request decoding alone sizes its tree on its own live costs (E(n) / t(n), corrected by
    what its lone steps took). Several decoding together share one forward: their trees are
    sized jointly (plan/joint_sizes.py), so drafted nodes go where they pay for every request's
    wait, and the whole decode fits n_batch."""
    drafting = scheduler.ngram
    lanes = [w for w in work if w.live.ngram is not None]
    looked = []
    for w in lanes:
        w.live.ngram.costs.follow(_context(w))
        start = w.live.ngram.clock()
        layout, limits = drafting.limits(w.live.request.method)
        trie, taken, values = w.live.ngram.lookup(w.live.root, limits,
                                                  bool(w.live.chooser.greedy),
                                                  alone=len(work) == 1)
        looked.append((w, layout, trie, taken, values, start, limits[0]))
    if len(work) == 1 and looked:          # alone: its own live costs size its tree
        w, _, _, _, values, _, max_nodes = looked[0]
        sizes = [w.live.ngram.best_size(values, max_nodes)[0] - 1]
    else:
        fixed = sum(len(w.tree) for w in work if w.live.ngram is None)
        table = drafting.step_ms_at(sum(_context(w) for w in work))
        sizes = joint_sizes([x[4] for x in looked], lambda total: measured_ms(table, total),
                            fixed, scheduler.target.n_batch, DRAFT_MARGIN)
    for (w, layout, trie, taken, values, start, _), k in zip(looked, sizes):
        if k == 0:                          # a plain step: no proposal to build (tensors)
            w.tree, w.proposed = ROOT_ONLY, True
            continue
        drafter = w.live.ngram
        proposal = drafter.proposal(trie, taken[:k], layout, drafter.clock() - start)
        proposal.expected_tokens = 1.0 + sum(values[:k])
        _set(w, proposal, scheduler.target.n_batch)


def _context(w) -> int:
    """Cells a request holds: its prompt and its tokens so far."""
    return len(w.live.request.prompt) + len(w.live.request.tokens)


def _set(w, proposal, room: int) -> None:
    """The request's part of the step: the proposal's tree, or the root alone when it drafts
    nothing (or, alone, would not fit one decode)."""
    size = len(proposal.layout.tree)
    if 1 < size <= room:
        w.tree, w.tokens, w.point_mass = proposal.layout.tree, proposal.tokens, \
            proposal.point_mass
        w.expected_tokens = proposal.expected_tokens
    else:
        if size > 1:
            w.live.ngram.withdraw()
        w.tree = ROOT_ONLY
    w.proposed = True


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
        live.request.prediction.draft_ratio = live.ngram.draft_ratio()
