"""Trees for a batch: how many tree nodes each live request gets in one batched step.

One batched step runs ONE target forward over every request's tree (N = sum of the tree sizes
tokens, costing t_target(N)) and one draft forward per tree level across requests (a level's
width is the sum of the requests' widths at that level). A bigger tree for one request buys
G_r(n + 1) - G_r(n) expected tokens but makes the shared forward longer for everybody, so the
best tree for a lone request is the wrong tree for eight (docs/design.md §3 for one request).

`BatchPlanner.plan(ps)` maximises expected accepted tokens per second of the whole step,

    sum_r G_r(n_r) / (t_target(sum_r n_r) + sum_levels t_draft(width of the level)),

by greedy marginal allocation: every request starts at budget 1 (plain batched decoding), then
one node at a time goes to the request whose G_r gains most per node (the DP's G(n, d) for its
acceptance vector, best depth per n); after each allocation whose total N was measured, the
step rate is evaluated and the best allocation seen is kept. At high load t_target(N) grows
faster than the tokens trees add, and the best allocation stays at budget 1 for everyone.

Only measured totals are candidates (t is not monotonic, nothing is interpolated, §3); a
request's tree must fit its lane (`max_leaves`) and the step must fit one decode (`max_total`).
Pure numpy, like the rest of redwood.plan.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from redwood.errors import RedwoodError
from redwood.plan.formats import Profile
from redwood.plan.planner import dp_table
from redwood.plan.tree import Tree

ROOT_ONLY = Tree([-1], {"kind": "root only", "planner": "batch"})


@dataclass
class BatchPlan:
    """Trees for the live requests (same order as asked) and what the planner predicted."""
    trees: list[Tree]
    total_tokens: int                  # N: tokens of the step's target forward
    expected_tokens: float             # sum of G_r over the requests
    step_ms: float | None              # predicted target + draft time (None: not measured)
    tokens_per_second: float | None


class _Options:
    """For one acceptance vector: G(n) and its tree for every budget n <= max_budget whose
    best tree fits `max_leaves` leaves (other budgets are skipped)."""

    def __init__(self, p: tuple, max_budget: int, max_depth: int, max_leaves: int):
        table = dp_table(np.asarray(p), max_budget, max_depth)
        self.values = {1: 1.0}
        self.trees = {1: ROOT_ONLY}
        self.levels = {1: []}
        for n in range(2, table.budget + 1):
            row = table.values[n, 1:]
            if not np.isfinite(row).any():
                continue
            best = float(np.nanmax(row))
            depth = int(np.argmax(row >= best - 1e-12)) + 1      # fewest levels at the best value
            tree = table.tree(n, depth, {"planner": "batch"})
            if sum(1 for kids in tree.children if not kids) > max_leaves:
                continue
            self.values[n], self.trees[n] = best, tree
            self.levels[n] = list(tree.level_sizes[:-1])        # draft widths, root level first
        self.budgets = sorted(self.values)

    def next_budget(self, n: int) -> int | None:
        later = [m for m in self.budgets if m > n and self.values[m] > self.values[n] + 1e-12]
        return later[0] if later else None


class BatchPlanner:
    """Greedy marginal allocation of tree nodes across requests (module doc).

    profile: target_ms by total tokens N of a batched forward, draft_ms by level width;
    max_budget / max_depth: per-request tree limits; max_leaves: a lane's sequence ids;
    max_total: tokens one decode may carry (n_batch)."""

    def __init__(self, profile: Profile, max_budget: int = 16, max_depth: int = 8,
                 max_leaves: int = 16, max_total: int = 512, speculate: bool = True):
        for value, what in ((max_budget, "max_budget"), (max_depth, "max_depth"),
                            (max_leaves, "max_leaves"), (max_total, "max_total")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RedwoodError(f"{what} must be a positive integer, got {value!r}")
        self.profile = profile
        self.max_budget = max_budget if speculate else 1
        self.max_depth, self.max_leaves, self.max_total = max_depth, max_leaves, max_total
        self._options: dict[tuple, _Options] = {}
        self._plans: dict[tuple, BatchPlan] = {}

    @property
    def max_nodes(self) -> int:
        """The most nodes a request's tree may have (KV cells it may hold beyond its text)."""
        return self.max_budget

    def plan(self, ps: list) -> BatchPlan:
        """Trees for requests with acceptance vectors `ps` (one per live request)."""
        keys = [tuple(round(float(x), 6) for x in p) for p in ps]
        if not keys:
            return BatchPlan([], 0, 0.0, None, None)
        order = sorted(range(len(keys)), key=lambda i: keys[i])
        composition = tuple(keys[i] for i in order)
        plan = self._plans.get(composition)
        if plan is None:
            if len(self._plans) >= 1024:
                self._plans.clear()
            plan = self._plans[composition] = self._allocate(composition)
        trees = [None] * len(keys)
        for slot, i in enumerate(order):
            trees[i] = plan.trees[slot]
        return BatchPlan(trees, plan.total_tokens, plan.expected_tokens, plan.step_ms,
                         plan.tokens_per_second)

    def _options_for(self, key: tuple) -> _Options:
        if key not in self._options:
            budget = self.max_budget if any(x > 0 for x in key) else 1
            self._options[key] = _Options(key, budget, self.max_depth, self.max_leaves)
        return self._options[key]

    def _allocate(self, keys: tuple) -> BatchPlan:
        options = [self._options_for(k) for k in keys]
        budgets = [1] * len(keys)
        best = self._evaluate(options, budgets)
        best_budgets = list(budgets)
        total = len(keys)
        while True:
            choice, choice_rate = None, 0.0
            for r, opt in enumerate(options):
                nxt = opt.next_budget(budgets[r])
                if nxt is None or total + nxt - budgets[r] > self.max_total:
                    continue
                rate = (opt.values[nxt] - opt.values[budgets[r]]) / (nxt - budgets[r])
                if rate > choice_rate + 1e-12:
                    choice, choice_rate = (r, nxt), rate
            if choice is None:
                break
            r, nxt = choice
            total += nxt - budgets[r]
            budgets[r] = nxt
            if total > max(self.profile.target_ms):
                break
            candidate = self._evaluate(options, budgets)
            if candidate.tokens_per_second is not None and (
                    best.tokens_per_second is None
                    or candidate.tokens_per_second > best.tokens_per_second):
                best, best_budgets = candidate, list(budgets)
        if best.tokens_per_second is None:           # nothing measured: plain batched decoding
            best_budgets = [1] * len(keys)
        return self._evaluate(options, best_budgets)

    def _evaluate(self, options: list[_Options], budgets: list[int]) -> BatchPlan:
        trees = [opt.trees[n] for opt, n in zip(options, budgets)]
        total = sum(budgets)
        expected = sum(opt.values[n] for opt, n in zip(options, budgets))
        target = self.profile.target_ms.get(total)
        draft = self._draft_ms(options, budgets)
        if target is None or draft is None:
            return BatchPlan(trees, total, expected, None, None)
        step = target + draft
        return BatchPlan(trees, total, expected, step, 1000.0 * expected / step)

    def _draft_ms(self, options: list[_Options], budgets: list[int]) -> float | None:
        """One draft forward per level across requests; a level's width is the sum of the
        requests' widths there (the draft cost of design §3, summed over the batch)."""
        widths: list[int] = []
        for opt, n in zip(options, budgets):
            for level, width in enumerate(opt.levels[n]):
                if level == len(widths):
                    widths.append(0)
                widths[level] += width
        total = 0.0
        for width in widths:
            t = self.profile.draft_level_ms(width)
            if t is None:
                return None
            total += t
        return total


class FixedPlanner:
    """The same tree for every speculating request (tests, and `--tree FILE` on the batched
    server); requests whose acceptance vector is all 0 get the root alone."""

    def __init__(self, tree: Tree, max_total: int = 512):
        self.tree, self.max_total = tree, max_total

    @property
    def max_nodes(self) -> int:
        return len(self.tree)

    def plan(self, ps: list) -> BatchPlan:
        if len(self.tree) * len(ps) > self.max_total:
            raise RedwoodError(f"{len(ps)} trees of {len(self.tree)} nodes exceed one decode of "
                               f"{self.max_total} tokens; use a smaller tree or max_batch")
        # A request that does not speculate (acceptance all 0: autoregressive) gets the root.
        trees = [self.tree if any(float(x) > 0 for x in p) else ROOT_ONLY for p in ps]
        return BatchPlan(trees, sum(len(t) for t in trees), float("nan"), None, None)

