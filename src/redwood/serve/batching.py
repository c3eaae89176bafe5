"""Continuous batching of speculative requests on the llama.cpp backend.

    scheduler = BatchScheduler(target_ctx, draft_ctx, planner)     # MultiSeqContexts, a planner
    request = scheduler.submit(BatchRequest(prompt_ids, SamplingParams(64, 0.7, seed=1)))
    while scheduler.step(): ...                                      # or run() / a server thread

Up to `max_batch` requests are live at once; each holds one lane (a range of sequence ids) in
the target's and in the draft's context. Requests join and leave between steps. One step:
1. the planner gives every ready request a tree for this batch (plan/batch_planner.py: trees
   shrink as the batch grows, down to the root alone = plain batched decoding);
2. the draft runs once per tree level across requests (batch_steps.draft_phase); a request's
   draft catches up on its text only once the planner gives it a tree;
3. ONE target `llama_decode` runs every request's tree, plus chunks of new requests' prompts in
   the room left (batch_steps.target_phase);
4. each request verifies its own tree with redwood.decode.verify (the engine's functions, its
   own torch.Generator seeded from its seed, its own sampling settings), both lanes keep the
   accepted path, and the new tokens go to the request's `on_tokens` callback;
5. the step's time (steps 2-4, from `clock`) goes back to the planner (`planner.observe`),
   which corrects its profile's predictions by it (plan/step_costs.py), unless the step
   carried prompt chunks or draft catch-up chunks: their time is not what the plan predicted.
The per-request order of random draws is the engine's (children level by level, then the
verifier), so the output law is exactly the target's (docs/design.md §4) whatever shares the
batch. A request whose cancel flag is set is removed at the next step; its lanes are freed
(seq_rm of all its ids) without touching the others.

Prefix cache (serve/prefix_reuse.py): a finished request's cells stay cached in both contexts;
a new request reuses the longest cached (or live) prefix of its prompt and prefills the rest;
requests prefilling a shared prefix together evaluate it once. Idle caches are evicted (LRU)
when a reservation needs their cells or they exceed `cache_tokens`.

Bounds: at most max_batch live requests; a request needs prompt + max_tokens + the largest
tree's cells in each context, reserved at admission, so a live request can never run out of
cache mid-stream; one that could never fit is refused at `submit` (RedwoodError).
"""
from __future__ import annotations

import collections
import time
from typing import Callable

import torch

from redwood.backends.llamacpp_multi import MultiSeqContext
from redwood.decode.drafter import ChildChooser
from redwood.errors import RedwoodError
from redwood.serve import batch_ngram, batch_steps, prefix_reuse
from redwood.serve.batch_requests import BatchRequest, Live, StepInfo

METHODS = ("sequoia", "specinfer", "chain", "autoregressive")
MAX_FAILED_STEPS = 3          # consecutive failed steps before the live requests are failed


class BatchScheduler:
    """Continuous batching over a target (and optionally a draft) MultiSeqContext.

    planner: BatchPlanner or FixedPlanner (plan(ps) -> BatchPlan). acceptance(params) -> p:
    each request's acceptance vector for the planner (default: every p_k 0 = no speculation).
    draft None: no speculation at all (plain batched decoding). prefill_chunk: most prompt
    tokens per context per step, so a long prompt does not stall the live requests
    (lone_prefill_chunk: per step when no request decodes; None = prefill_chunk). clock:
    seconds, for the step times the planner learns from (tests inject one). prefix_cache:
    keep finished requests' cells and reuse them (False: every prompt is prefilled afresh);
    cache_tokens: most cells the idle caches of other requests than the last finished one may
    hold per context (None = 0: they slow every live step, serve/prefix_reuse.py). ngram: a
    batch_ngram.BatchNgramDrafting to draft by prompt lookup instead of a draft model (draft
    None, the planner plain: each request's drafter sizes its own trees)."""

    def __init__(self, target: MultiSeqContext, draft: MultiSeqContext | None, planner,
                 acceptance: Callable | None = None, max_batch: int | None = None,
                 prefill_chunk: int = 256, clock: Callable[[], float] = time.perf_counter,
                 prefix_cache: bool = True, cache_tokens: int | None = None,
                 lone_prefill_chunk: int | None = None, ngram=None):
        lanes = len(target.lanes) if draft is None else min(len(target.lanes), len(draft.lanes))
        max_batch = lanes if max_batch is None else max_batch
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) \
                or not 1 <= max_batch <= lanes:
            raise RedwoodError(f"max_batch must be in 1..{lanes} (the contexts' lanes), "
                               f"got {max_batch!r}")
        if draft is not None and draft.vocab_size != target.vocab_size:
            raise RedwoodError(f"vocabularies differ: target {target.name} has {target.vocab_size} "
                               f"tokens, draft {draft.name} has {draft.vocab_size}")
        if ngram is not None and draft is not None:
            raise RedwoodError("the batch drafts with the draft model or by prompt lookup, not "
                               "both: give no draft context with ngram")
        tree = getattr(planner, "tree", None)
        if tree is not None:
            for ctx in (target, draft):
                if ctx is not None:
                    ctx.check_tree(tree)
            if len(tree) * max_batch > target.n_batch:
                raise RedwoodError(f"{max_batch} trees of {len(tree)} nodes exceed n_batch = "
                                   f"{target.n_batch}")
        self.target, self.draft, self.planner, self.ngram = target, draft, planner, ngram
        self.acceptance = acceptance or (lambda params: (0.0,))
        self.max_batch, self.prefill_chunk = max_batch, max(1, int(prefill_chunk))
        self.lone_prefill_chunk = max(self.prefill_chunk, int(lone_prefill_chunk or 0))
        self.clock = clock
        if cache_tokens is not None and (isinstance(cache_tokens, bool)
                                         or not isinstance(cache_tokens, int) or cache_tokens < 0):
            raise RedwoodError(f"cache_tokens must be a non-negative integer, got {cache_tokens!r}")
        self.prefix_cache, self.cache_tokens = bool(prefix_cache), cache_tokens or 0
        self.cache_stats = prefix_reuse.PrefixCacheStats()
        self.waiting: collections.deque[BatchRequest] = collections.deque()
        self.live: list[Live] = []
        self.reserved = 0
        self.failures = 0
        self.last = StepInfo()
        self.eos_ids = frozenset(target.eos_ids)
        self.tree = None              # for the server's context check: no fixed tree depth
        self.batched = True           # the server runs a BatchWorker for it

    # -- limits ------------------------------------------------------------------------
    @property
    def cell_capacity(self) -> int:
        return min(c.n_ctx for c in (self.target, self.draft) if c is not None)

    @property
    def max_nodes(self) -> int:
        """The largest tree a request may run (the planner's, or its n-gram drafter's budget)."""
        return max(self.planner.max_nodes, self.ngram.max_nodes if self.ngram else 0)

    @property
    def max_positions(self) -> int:
        """Prompt + max_tokens a lone request may have (cells minus its largest tree)."""
        return self.cell_capacity - self.max_nodes

    def cells_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        return prompt_len + max_new_tokens + self.max_nodes

    def room_for(self, prompt_len: int, max_new_tokens: int) -> bool:
        """Whether a request of this size would be admitted at the next step."""
        return (len(self.live) + len(self.waiting) < self.max_batch
                and self.reserved + sum(self._need(r) for r in self.waiting)
                + self.cells_needed(prompt_len, max_new_tokens) <= self.cell_capacity)

    @property
    def idle(self) -> bool:
        return not self.live and not self.waiting

    # -- requests ------------------------------------------------------------------------
    def submit(self, request: BatchRequest) -> BatchRequest:
        """Queue a request (admitted at a step when a lane and its cells are free). Raises
        RedwoodError if it is invalid or could never fit the cache."""
        if request.method not in METHODS:
            raise RedwoodError(f"unknown method {request.method!r}; choose one of "
                               f"{', '.join(METHODS)}")
        prompt = [int(t) for t in request.prompt]
        if not prompt:
            raise RedwoodError("the prompt is empty: give at least one token")
        if min(prompt) < 0 or max(prompt) >= self.target.vocab_size:
            raise RedwoodError(f"prompt token ids must lie in [0, {self.target.vocab_size})")
        need = self._need(request)
        if need > self.cell_capacity:
            raise RedwoodError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({request.params.max_new_tokens}) + "
                f"tree ({self.max_nodes} nodes) = {need} cells exceed the batch cache of "
                f"{self.cell_capacity} cells; shorten the prompt or lower max_tokens")
        request.prompt = prompt
        self.waiting.append(request)
        return request

    def _need(self, request: BatchRequest) -> int:
        return self.cells_needed(len(request.prompt), request.params.max_new_tokens)

    def _admit(self) -> None:
        while self.waiting and len(self.live) < self.max_batch:
            request = self.waiting[0]
            if request.cancel_requested:
                self.waiting.popleft()
                self._finish(None, request, "cancelled")
                continue
            need = self._need(request)
            if self.reserved + need > self.cell_capacity:
                break                                    # FIFO: wait for cells to free up
            self.waiting.popleft()
            self.live.append(self._start(request, need))
            self.reserved += need

    def _start(self, request: BatchRequest, need: int) -> Live:
        params = request.params
        generator = torch.Generator()
        generator.manual_seed(params.seed if params.seed is not None else torch.seed())
        p = tuple(float(x) for x in self.acceptance(params))
        if request.method == "chain":
            p = p[:1]
        elif request.method == "autoregressive" or self.draft is None:
            p = (0.0,)
        chooser = ChildChooser.for_request(params, request.method, generator)
        prefix = request.prompt[:-1]
        reuse = self.prefix_cache and request.cache_prompt
        target_lane, cached = self._take_lane(self.target, prefix, reuse, need, self.cache_stats)
        draft_lane, drafted = (self._take_lane(self.draft, prefix, reuse, need)
                               if self.draft is not None else (None, 0))
        request.cached_tokens = cached
        ngram = (self.ngram.start(prefix, request.ngram_memory)
                 if self.ngram is not None and request.method != "autoregressive" else None)
        return Live(request, p, generator, chooser, target_lane, draft_lane, need,
                    root=request.prompt[-1], prefix=prefix, prefilled=cached,
                    pending=list(prefix[drafted:]) if draft_lane is not None else [],
                    ngram=ngram)

    def _take_lane(self, ctx, prefix, reuse, need, stats=None):
        """A lane for a new request (reusing a cached prefix), then room for its reservation."""
        lane, reused = prefix_reuse.take_lane(ctx, prefix, reuse, stats)
        prefix_reuse.make_room(ctx, self.reserved + need, self.cache_tokens, stats)
        if stats is not None and reuse:
            stats.lookups += 1
            stats.hits += reused > 0
            stats.reused_tokens += reused
        return lane, reused

    # -- the step ------------------------------------------------------------------------
    def step(self) -> bool:
        """One batched step; False when there was nothing to do."""
        start = self.clock()
        for live in [x for x in self.live if x.request.cancel_requested]:
            self._finish(live, live.request, "cancelled")
        self._admit()
        if not self.live:
            return False
        ready = [x for x in self.live if x.ready]
        lags = [len(x.pending) for x in ready] if self.draft is not None else None
        plan = self.planner.plan([x.acceptance.for_plan() for x in ready], lags)
        planned = self.clock()                  # the planned work starts: timed from here
        work = [batch_steps.Work(x, tree) for x, tree in zip(ready, plan.trees)]
        batch_steps.method_trees(work)
        batch_steps.hold_back_lagging_drafts(self, work)
        if self.ngram is not None:
            batch_ngram.propose(self, work)
        saved = [(w, w.live.draft_lane.length if w.live.draft_lane else 0, list(w.live.pending))
                 for w in work]
        info = StepInfo(live=len(self.live), decoding=len(work),
                        tree_sizes=[len(w.tree) for w in work],
                        catch_up=sum(w.catch_up for w in work))
        try:
            info.draft_decodes = batch_steps.draft_phase(self, work)
            info.target_tokens, firsts, decode_seconds = batch_steps.target_phase(self, work)
            info.prompt_tokens = info.target_tokens - sum(info.tree_sizes) - len(firsts)
        except Exception as exc:        # a failed decode: undo the step, retry, then give up
            self._undo(saved)
            batch_ngram.undo(work)
            self.failures += 1
            if self.failures >= MAX_FAILED_STEPS:
                for live in list(self.live):
                    live.request.error = exc
                    self._finish(live, live.request, "error")
            return True
        self.failures = 0
        for w, tree in zip(work, plan.trees):
            root, new = w.live.root, batch_steps.verify(self, w)
            batch_ngram.commit(w, root)
            w.live.acceptance.planned(len(tree) > 1)
            if w.speculative and w.live.ngram is None:
                w.live.acceptance.record(w.tree, w.path)
            info.new_tokens += self._emit(w.live, new, len(w.tree))
        for w in firsts:                # prompts completed this step: their first token
            root, new = w.live.root, batch_steps.verify(self, w)
            batch_ngram.commit(w, root)
            info.new_tokens += self._emit(w.live, new, 1)
        end = self.clock()
        info.seconds = end - start
        if work and not info.prompt_tokens and not info.catch_up:
            self.planner.observe(plan, end - planned)
            info.timed = True
            if not firsts:
                batch_ngram.record_cost(work, decode_seconds)
        self.last = info
        return True

    def run(self, max_steps: int = 100_000) -> None:
        """Step until every submitted request is done (bounded by max_steps)."""
        for _ in range(max_steps):
            if not self.step() and not self.waiting:
                return
        raise RedwoodError(f"requests still running after {max_steps} steps")

    def _undo(self, saved) -> None:
        for w, draft_length, pending in saved:
            self.target.drop_tentative(w.live.target_lane)
            if w.live.draft_lane is not None:
                self.draft.truncate(w.live.draft_lane, draft_length)
            w.live.pending = pending

    def _emit(self, live: Live, new: list[int], tree_size: int) -> int:
        """Hand a step's tokens to the request; end it on EOS, max_tokens or its callback."""
        request = live.request
        new = new[: request.params.max_new_tokens - len(request.tokens)]
        finish = None
        if request.stop_on_eos:
            for i, token in enumerate(new):
                if token in self.eos_ids:
                    new, finish = new[: i + 1], "eos"
                    break
        if finish is None and len(request.tokens) + len(new) >= request.params.max_new_tokens:
            finish = "length"
        request.tokens.extend(new)
        request.steps.append(len(new))
        request.tree_sizes.append(tree_size)
        live.root = new[-1]
        try:
            if request.on_tokens is not None and request.on_tokens(request, new) is False:
                finish = finish or "stopped"
        except Exception as exc:        # a broken consumer ends its own request only
            request.error, finish = exc, "error"
        if finish is not None:
            self._finish(live, request, finish)
        return len(new)

    def _finish(self, live: Live | None, request: BatchRequest, reason: str) -> None:
        if live is not None:
            batch_ngram.finish(live, reason)
            keep = self.prefix_cache and reason != "error"   # an error may leave cells unsure
            self.live.remove(live)
            self.reserved -= live.cells
            for ctx, lane in ((self.target, live.target_lane), (self.draft, live.draft_lane)):
                if lane is not None:
                    ctx.release(lane, keep=keep)
                    prefix_reuse.make_room(ctx, self.reserved, self.cache_tokens,
                                           self.cache_stats if ctx is self.target else None,
                                           spare=lane)
        request.finish_reason = reason
        if request.on_finish is not None:
            try:
                request.on_finish(request)
            except Exception as exc:  # noqa: BLE001 - the consumer's problem, not the batch's
                request.error = request.error or exc

    def close(self) -> None:
        """Cancel everything (waiting and live) and free every lane."""
        while self.waiting:
            self._finish(None, self.waiting.popleft(), "cancelled")
        for live in list(self.live):
            self._finish(live, live.request, "cancelled")
