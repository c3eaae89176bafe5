"""The batching scheduler's prefix cache policy (the cells and their index live in
backends/llamacpp_multi.py; docs/design.md §5.5).

- A finished request's lanes stay cached: its committed cells remain in the KV cache, indexed
  by their tokens in the context's radix tree.
- A new request takes, per context, the idle lane sharing the longest prefix with what it would
  prefill (its prompt minus the last token, which runs as the first root), keeps those cells
  and prefills only the rest; if a live request holds a longer prefix, the missing cells are
  shared from it (`seq_cp`: one set of cells serves both).
- While requests that share a prefix prefill together (one long system prompt, many users),
  only the earliest admitted one runs the shared part; the others wait for it and then share
  its cells, so the prefix is evaluated once (`share_prefill`, `waits_for_leader`).
- Bounded, and cheap for the live requests: in one KV cache every decode attends over all the
  cells in use, masked or not, so a cached idle conversation slows every live request's steps
  (on a 2-core EPYC t(1) grew 36 -> 43 ms from 128 to 1,024 cells). Idle caches other than the
  last finished request's are therefore kept only up to `cache_tokens` cells (default 0: like
  a llama-server slot, the last conversation stays until another request starts), evicted least
  recently used first, and whenever a request's reservation needs their cells. A live
  request's cells are never evicted and a request never fails because of the cache (evicting
  every idle lane always leaves its reservation room, which admission checked).
"""
from __future__ import annotations

from dataclasses import dataclass

from redwood.backends.llamacpp_multi import Lane, MultiSeqContext
from redwood.backends.radix_tree import common_prefix


@dataclass
class PrefixCacheStats:
    """Counters of the target context's prefix cache (the server exports them)."""
    lookups: int = 0                  # requests that looked for a cached prefix
    hits: int = 0                     # ... and reused at least one cell
    reused_tokens: int = 0            # prompt tokens not evaluated: cached or shared cells
    shared_tokens: int = 0            # of which shared from a live request
    evictions: int = 0                # idle caches evicted
    evicted_tokens: int = 0


def take_lane(ctx: MultiSeqContext, prefix: list[int], reuse: bool,
              stats: PrefixCacheStats | None = None) -> tuple[Lane, int]:
    """(lane, cells reused): the idle lane caching the longest prefix of `prefix` (reuse
    False or no match: an empty lane, else the least recently used cache is evicted), topped
    up from a live lane that holds more of it."""
    length, lane = ctx.cached_prefix(prefix) if reuse else (0, None)
    if lane is None:
        lane, length = ctx.free_lane(), 0
        evicted = ctx.evict(lane)
        if evicted and stats is not None:
            stats.evictions += 1
            stats.evicted_tokens += evicted
    lane = ctx.acquire(lane, length)
    if reuse:
        share_prefill(ctx, lane, prefix)
    return lane, lane.length


def make_room(ctx: MultiSeqContext, reserved: int, budget: int,
              stats: PrefixCacheStats | None = None, spare: Lane | None = None) -> None:
    """Evict idle caches, least recently used first, until live reservations plus idle caches
    fit the context and the idle caches other than `spare` (the request that just finished:
    its next turn may follow) hold at most `budget` cells."""
    idle = sorted((x for x in ctx.lanes if not x.busy and x.length and x is not spare),
                  key=lambda x: x.used)
    for lane in idle:
        others = ctx.idle_cells() - (spare.length if spare is not None else 0)
        if reserved + ctx.idle_cells() <= ctx.n_ctx and others <= budget:
            return
        cells = ctx.evict(lane)
        if stats is not None:
            stats.evictions += 1
            stats.evicted_tokens += cells


def share_prefill(ctx: MultiSeqContext, lane: Lane, prefix: list[int]) -> int:
    """Before a prefill chunk: take from a live lane whatever of `prefix` it already holds
    beyond this lane's cells. Returns the cells shared."""
    more, source = ctx.live_prefix(prefix, exclude=lane)
    if more <= lane.length or lane.step is not None or source.step is not None:
        return 0
    before = lane.length
    ctx.share(source, lane, min(more, len(prefix)))
    return lane.length - before


def waits_for_leader(prefilling: list, live) -> bool:
    """Whether `live` (still prefilling) should skip its chunk this step: an earlier admitted
    request that also prefills is still evaluating tokens `live` needs next, and will share
    them. `prefilling`: the scheduler's not-ready requests in admission order."""
    for other in prefilling:
        if other is live:
            return False
        if common_prefix(other.prefix, live.prefix) > live.prefilled:
            return True
    return False
