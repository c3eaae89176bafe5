"""The phases of one batched step (batching.BatchScheduler.step): draft level by level across
requests, one target decode for every tree (plus prompt chunks), per-request verification.

Each request's draws come from its own generator in the engine's order (its children level by
level, then the verifier's uniforms and bonus; a position's own uniforms for point-mass trees
and plain steps at a temperature, decode/token_sampler.py), and drafting follows
DraftModelDrafter.propose without pruning, so the batch changes only which kernels compute the
logits.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from redwood.backends.llamacpp_multi import Append, TreeNodes
from redwood.decode.draft_model import DraftModelDrafter
from redwood.decode.verify import verify_step
from redwood.plan.batch_planner import ROOT_ONLY
from redwood.plan.tree import Tree
from redwood.serve import prefix_reuse

# A request whose draft lags by more than this many tokens does not speculate this step: its
# draft catches up by chunks first (prefill_chunk tokens a step for all such requests).
CATCH_UP = 16


@dataclass(eq=False)
class Work:
    """One ready request's part of the step."""
    live: object                      # batching.Live
    tree: Tree
    tokens: torch.Tensor | None = None        # [n] long, node tokens (tokens[0] = root)
    draft_probs: torch.Tensor | None = None   # [n, V] float32 at nodes that got sampled children
    ran: set = field(default_factory=set)     # nodes the draft ran (they had children)
    catch_up: bool = False                    # planned a tree, but its draft lags: root only
    logits: torch.Tensor | None = None        # [n, V] target logits after each node
    row: np.ndarray | None = None             # [V] a plain step's logits in place (or logits)
    path: list | None = None                  # accepted nodes from the root (verify)
    point_mass: torch.Tensor | None = None    # [n] bool: n-gram nodes (batch_ngram.py)
    proposed: bool = False                    # its n-gram drafter proposed this step
    expected_tokens: float | None = None      # the drafter's E(tokens kept), bonus included

    @property
    def speculative(self) -> bool:
        return len(self.tree) > 1


_CHAINS: dict[int, Tree] = {}


def method_trees(work: list[Work]) -> None:
    """The `chain` method runs one child per level, as deep as the planned tree (the engine's
    rule); the batch planner already plans chains for it (its p has one entry), a fixed tree
    is turned into one here."""
    for w in work:
        if w.live.request.method == "chain" and any(len(k) > 1 for k in w.tree.children):
            depth = w.tree.num_levels
            if depth not in _CHAINS:
                _CHAINS[depth] = Tree(list(range(-1, depth - 1)), {"kind": "chain"})
            w.tree = _CHAINS[depth]


def hold_back_lagging_drafts(scheduler, work: list[Work]) -> None:
    """A request given a tree whose draft lags more than CATCH_UP tokens (a fresh prompt, or a
    stretch without speculation) runs its root alone this step and catches up instead."""
    if scheduler.draft is None:
        return
    for w in work:
        if w.speculative and len(w.live.pending) > CATCH_UP:
            w.tree, w.catch_up = ROOT_ONLY, True


def draft_phase(scheduler, work: list[Work]) -> int:
    """Draft every speculative tree: one decode for every request's pending tokens + root (and
    catch-up chunks), then one per level that has children. Returns the draft decodes run."""
    draft = scheduler.draft
    if draft is None:
        return 0
    spec = [w for w in work if w.speculative]
    items = [(w.live.draft_lane, w.live.pending + [w.live.root], 1) for w in spec]
    room = scheduler.prefill_chunk
    for w in sorted((w for w in work if w.catch_up), key=lambda w: len(w.live.pending)):
        if room > 0:
            chunk, w.live.pending = w.live.pending[:room], w.live.pending[room:]
            items.append((w.live.draft_lane, chunk, 0))
            room -= len(chunk)
    logits, decodes = run_appends(draft, items)
    expanding = {}
    for w, rows in zip(spec, logits):
        w.live.pending = []
        w.tokens = torch.empty(len(w.tree), dtype=torch.long)
        w.tokens[0] = w.live.root
        expanding[w] = ([0], rows)
    holders = {w: {} for w in spec}
    while expanding:
        jobs, nodes_of = [], {}
        for w, (nodes, rows) in expanding.items():
            tree = w.tree
            DraftModelDrafter._assign_children(tree, nodes, rows, w.tokens, w.live.chooser,
                                               len(tree), holders[w], False)
            level = [kid for u in nodes for kid in tree.children[u] if tree.children[kid]]
            if level:
                lane = w.live.draft_lane
                jobs.append(TreeNodes(lane, tree, level, w.tokens[level], lane.length - 1))
                nodes_of[w] = level
        if not jobs:
            break
        outs = draft.decode(jobs)
        decodes += 1
        expanding = {w: (nodes_of[w], out) for w, out in zip(nodes_of, outs)}
        for w, level in nodes_of.items():
            w.ran.update(level)
    for w in spec:
        w.draft_probs = holders[w].get("probs")
    return decodes


def target_phase(scheduler, work: list[Work]) -> tuple[int, list[Work], float]:
    """ONE target decode: every request's tree (the root alone when it does not speculate),
    plus prompt chunks of new requests in the room left. A chunk that completes its request's
    prompt also runs the root, so the first token comes from this decode (as llama-server's
    does) instead of a step later: those requests come back as root-alone Work with their
    logits, to verify and emit like any plain step. Returns (tokens decoded, those Work, the decode's seconds)."""
    target = scheduler.target
    jobs = []
    for w in work:
        lane = w.live.target_lane
        if w.speculative:
            jobs.append(TreeNodes(lane, w.tree, range(len(w.tree)), w.tokens, lane.length))
        else:
            jobs.append(Append(lane, [w.live.root], rows=1))
    used = sum(len(w.tree) for w in work)
    chunks = prefill_chunks(scheduler, target.n_batch - used)
    decoded = used + sum(len(ids) for ids, _ in chunks)
    firsts = []                                  # per chunk: does it also run the root?
    for ids, live in chunks:
        first = (live.prefilled + len(ids) == len(live.prefix)
                 and decoded + sum(firsts) < target.n_batch)
        firsts.append(first)
        jobs.append(Append(live.target_lane, list(ids) + [live.root] * first, int(first)))
    if not jobs:
        return 0, [], 0.0
    plain = not chunks and not any(w.speculative for w in work)
    start = scheduler.clock()
    # views: verify reads them before the next decode; a plain step's rows as numpy alone
    outs = target.decode_rows(jobs) if plain else target.decode(jobs, copy=False)
    seconds = scheduler.clock() - start
    for w, out in zip(work, outs):
        if plain:
            w.row = out
        else:
            w.logits = out
    first_work = []
    for (ids, live), first, out in zip(chunks, firsts, outs[len(work):]):
        live.prefilled += len(ids)
        if first:
            first_work.append(Work(live, ROOT_ONLY, logits=out))
    return decoded + len(first_work), first_work, seconds


def verify(scheduler, w: Work) -> list[int]:
    """Verify one request's tree with the engine's rules; keep the path in both lanes.
    Returns the step's new tokens (accepted path, then the bonus)."""
    live = w.live
    position = len(live.request.tokens)                # the index of the step's first new token
    if not w.speculative:                      # the root was appended: sample the next token
        row = w.row if w.row is not None else w.logits[0].numpy()
        bonus = live.sampler.token(row, position)
        if live.draft_lane is not None:
            live.pending.append(live.root)     # committed in the target, never run by the draft
        return [bonus]
    tree = w.tree
    path, bonus = verify_step(w.logits, w.tokens, tree, w.draft_probs, w.point_mass, live.chooser,
                              live.sampler, position)
    w.path = [int(u) for u in path]
    scheduler.target.keep_path(live.target_lane, path)
    if live.draft_lane is not None:
        scheduler.draft.keep_path(live.draft_lane, [u for u in path[1:] if u in w.ran])
        live.pending = [int(w.tokens[u]) for u in path[1:] if u not in w.ran]
    return [int(w.tokens[u]) for u in path[1:]] + [int(bonus)]


def prefill_chunks(scheduler, room: int) -> list[tuple]:
    """(ids, live) prompt chunks for requests still prefilling the target, at most `room` and
    prefill_chunk tokens in all. The shortest remaining prompt goes first (then the earliest
    admitted), so a short request is not stuck behind a long prompt's chunks: its first token
    comes a step after admission. When no request decodes, chunks may be lone_prefill_chunk
    long (the server's whole batch, as llama-server's prefill: larger chunks run faster).
    With the prefix cache, a request first shares what a live request already evaluated of its
    prompt, and skips its chunk while an earlier request
    still evaluates the prefix they share (serve/prefix_reuse.py)."""
    alone = not any(x.ready for x in scheduler.live)   # none decodes: no step to delay
    room = min(room, scheduler.lone_prefill_chunk if alone else scheduler.prefill_chunk)
    chunks = []
    waiting = [x for x in scheduler.live if not x.ready]
    if scheduler.prefix_cache:
        waiting = _after_sharing(scheduler, waiting)
    for live in sorted(waiting, key=lambda x: len(x.prefix) - x.prefilled):
        if room <= 0:
            break
        ids = live.prefix[live.prefilled:live.prefilled + room]
        chunks.append((ids, live))
        room -= len(ids)
    return chunks


def _after_sharing(scheduler, waiting: list) -> list:
    """Share live cells into the prefilling requests; those that must wait for a leader drop
    out of this step's chunks."""
    stats, runnable = scheduler.cache_stats, []
    for live in waiting:
        if not live.request.cache_prompt:
            runnable.append(live)
            continue
        shared = prefix_reuse.share_prefill(scheduler.target, live.target_lane, live.prefix)
        if shared:
            live.prefilled += shared
            live.request.cached_tokens += shared
            stats.reused_tokens += shared
            stats.shared_tokens += shared
        if not live.ready and not prefix_reuse.waits_for_leader(waiting, live):
            runnable.append(live)
    return runnable


def run_appends(ctx, items: list[tuple]) -> tuple[list, int]:
    """Run causal appends (lane, ids, rows) packed into as few decodes of at most n_batch
    tokens as possible (an item may be split: its rows come from its last piece). Returns
    (each item's logits [rows, V], decodes run)."""
    groups, group, room = [], [], ctx.n_batch
    for index, (lane, ids, rows) in enumerate(items):
        start = 0
        while start < len(ids):
            if room == 0:
                groups.append(group)
                group, room = [], ctx.n_batch
            take = min(room, len(ids) - start)
            end = start + take
            group.append((index, lane, ids[start:end], max(0, rows - (len(ids) - end))))
            start, room = end, room - take
    if group:
        groups.append(group)
    results = [torch.empty(0, ctx.vocab_size) for _ in items]
    for group in groups:
        # One piece per lane per decode: items are distinct lanes, an item's pieces fall in
        # successive decodes.
        outs = ctx.decode([Append(lane, ids, rows) for _, lane, ids, rows in group])
        for (index, _, _, rows), out in zip(group, outs):
            if rows:
                results[index] = out
    return results, len(groups)
