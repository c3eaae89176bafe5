"""How many drafted nodes each request gets when several share one target decode.

Free drafts (prompt lookup) cost nothing to make, but every drafted node is one more token in
the step's single target forward, and every request in the batch waits for that forward. A
request alone picks the tree size n that maximises E(n) / t(n) (decode/ngram_drafter.py). With
L requests decoding together, the step costs t(T) for T = all roots + all drafted nodes, and
it yields every request's expected tokens, so the right choice is the allocation that
maximises

    (Σ_r E_r(k_r)) / t(Σ_r (1 + k_r) + fixed),

not each request's lone optimum: on a CPU where t(n) is nearly linear in n, eight requests
each drafting a 16-node copy (a 136-token decode) make every lane wait for all of them, and a
step that would have decoded eight tokens in t(8) now takes many times as long.

Each request's candidate nodes come best-first with non-increasing path values (the
probability that the target keeps the node, ngram_trees.best_first), so its expected tokens
after k nodes are 1 + the sum of its first k values. Greedy marginal allocation is then exact
for a fixed total: the next node is always the best one not yet taken by anyone. Every total
is rated with the step's cost and the best total kept (ties to the smaller). With one request
this is the lone rule E(n) / t(n), margin included: drafts are kept only when the step's rate
beats the all-plain step's by the margin (the n-gram drafter's DRAFT_MARGIN: E rests on
estimates that can be off by more than a few %). Pure python, like the rest of redwood.plan.
"""
from __future__ import annotations

import heapq


def joint_sizes(values: list[list[float]], step_ms, fixed: int = 0,
                max_total: int | None = None, margin: float = 0.0) -> list[int]:
    """Drafted nodes per request (beyond its root) for one shared decode.

    values[r]: request r's candidate nodes' path values, best first (non-increasing).
    step_ms(T): the predicted ms of one target decode over T tokens (positive).
    fixed: tokens other requests put in the decode that draft nothing here (their roots,
    each yielding one token). max_total: the most tokens the decode may hold. margin: the
    fraction by which a drafting allocation must beat the all-plain step's rate."""
    lanes = len(values) + fixed
    if not values:
        return []
    taken = [0] * len(values)
    heap = [(-v[0], r) for r, v in enumerate(values) if v]
    heapq.heapify(heap)
    total, expected = lanes, float(lanes)
    plain_rate = expected / step_ms(total)
    best_rate, best = plain_rate, list(taken)
    while heap and (max_total is None or total < max_total):
        negative, r = heapq.heappop(heap)
        taken[r] += 1
        total += 1
        expected -= negative
        if taken[r] < len(values[r]):
            heapq.heappush(heap, (-values[r][taken[r]], r))
        rate = expected / step_ms(total)
        if rate > best_rate * (1.0 + 1e-9):
            best_rate, best = rate, list(taken)
    if best_rate < plain_rate * (1.0 + margin):
        return [0] * len(values)
    return best
