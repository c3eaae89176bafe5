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
A request whose draft lags its text by `lag` tokens must run them in the first draft decode
before it can speculate, so they count in that level's width. If no allocation beats every
request at budget 1 (plain batched decoding), the plan is plain and the draft does not run.

The profile is measured once; the steps it predicts then cost more (Python work it does not
model, a profile measured under load). `StepCosts` (plan/step_costs.py) learns observed /
predicted step time from the scheduler's timed steps, separately for speculative and plain
plans, and every candidate is rated with its predicted ms x the ratio of its kind, so a profile
that underestimates speculative steps stops choosing them within a few steps. Plans are cached
per composition and quantised ratios, so they follow the correction without replanning every
step; `observe(plan, seconds)` is how the scheduler reports a step.

`LiveAcceptance` keeps each request's acceptance vector live: the verifier's outcomes, decayed,
replace the data set's average (docs/design.md §3.2 for the single-request governor), so a
request whose drafts fail drops to plain decoding within a few steps and probes now and then,
less often after each probe that did not pay.
Pure numpy, like the rest of redwood.plan.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from redwood.errors import RedwoodError
from redwood.plan.formats import Profile
from redwood.plan.planner import dp_table
from redwood.plan.step_costs import StepCosts
from redwood.plan.tree import Tree

ROOT_ONLY = Tree([-1], {"kind": "root only", "planner": "batch"})
MAX_LAG = 16          # lag tokens counted in a plan (batch_steps.CATCH_UP: more wait for chunks)


class LiveAcceptance:
    """One request's positional acceptance vector, learnt from its own verified steps.

    p_k = hits_k / trials_k, the unconditional chance that the rank-k child is the accepted one
    (§2.1): every node of an accepted path that had c children is one trial for ranks 1..c and a
    hit for the rank of the child the path continues to (none at the path's end). The counts are
    decayed by `decay` per speculative step (about the last five steps weigh most) and start
    from the prior vector worth `prior_weight` trials. Only past outcomes enter, never the
    current step's draws, so the verifiers stay exact (the tree may depend on the past).

    After `interval` steps in a row without a tree, the plan is asked with the prior vector (a
    probe) until it gives a tree: whether it speculates is still the planner's cost-based
    choice. A probe costs steps at a loss when its tree does not pay, so the interval backs off:
    it starts at `probe_every`; when a probe's tree is followed by a plain step before
    `reset_after` speculative steps in a row (the live vector sent the request straight back),
    it doubles, up to `max_probe_every` (8, 16, 32, 64); once the request speculates in
    `reset_after` steps in a row, it is `probe_every` again. A probe that the planner answers
    with the root alone costs nothing and changes nothing (the next step probes again)."""

    def __init__(self, prior, prior_weight: float = 2.0, decay: float = 0.8,
                 probe_every: int = 8, resolution: float = 0.02, max_probe_every: int = 64,
                 reset_after: int = 3):
        self.prior = tuple(float(x) for x in prior)
        self.decay, self.probe_every, self.resolution = decay, probe_every, resolution
        self.max_probe_every, self.reset_after = max_probe_every, reset_after
        self.hits = prior_weight * np.asarray(self.prior, dtype=np.float64)    # [W]
        self.trials = np.full(len(self.prior), float(prior_weight))             # [W]
        self.plain_run = 0            # steps in a row without a tree
        self.speculative_run = 0      # steps in a row with a tree
        self.interval = probe_every   # plain steps before the next probe (backs off)
        self.probed = False           # speculating since a probe, not yet `reset_after` steps
        self.speculative_steps = 0
        self._p: tuple | None = None  # p, until the next record

    @property
    def p(self) -> tuple:
        """The live vector: non-increasing, sum <= 1, rounded down to `resolution` (plans are
        cached per composition, so nearby vectors share one; down keeps the sum <= 1)."""
        if self._p is None:                     # kept until the next record (asked every step)
            p = np.minimum.accumulate(self.hits / np.maximum(self.trials, 1e-12))
            total = p.sum()
            if total > 1.0:
                p = p / total
            steps = np.floor(p / self.resolution + 1e-9)
            self._p = tuple(round(float(x) * self.resolution, 6) for x in steps)
        return self._p

    @property
    def probing(self) -> bool:
        """Whether this step is a probe (planned with the prior vector)."""
        return self.plain_run >= self.interval and any(x > 0 for x in self.prior)

    def for_plan(self) -> tuple:
        """The vector to plan this step with: the live one, or the prior on a probe step."""
        return self.prior if self.probing else self.p

    def planned(self, speculative: bool) -> None:
        """The plan (asked with for_plan()) gave the request a tree or the root alone."""
        if speculative:
            self.probed = self.probed or self.probing
            self.plain_run, self.speculative_run = 0, self.speculative_run + 1
            if self.speculative_run >= self.reset_after:     # speculation pays again
                self.interval, self.probed = self.probe_every, False
            return
        if self.probed:                  # back to plain right after a probe: it did not pay
            self.interval = min(2 * self.interval, self.max_probe_every)
            self.probed = False
        self.plain_run, self.speculative_run = self.plain_run + 1, 0

    def record(self, tree: Tree, path) -> None:
        """A verified step: `path` the accepted nodes of `tree`, starting with the root."""
        width = len(self.hits)
        hits, trials = np.zeros(width), np.zeros(width)
        path = [int(u) for u in path]
        for i, u in enumerate(path):
            children = tree.children[u]
            trials[:min(len(children), width)] += 1
            if i + 1 < len(path) and tree.ranks[path[i + 1]] <= width:
                hits[tree.ranks[path[i + 1]] - 1] += 1
        self.hits = self.decay * self.hits + hits
        self.trials = self.decay * self.trials + trials
        self._p = None
        self.speculative_steps += 1


@dataclass
class BatchPlan:
    """Trees for the live requests (same order as asked) and what the planner predicted.
    step_ms is the profile's prediction, what the scheduler's timed step is compared with;
    tokens_per_second is rated with it corrected: expected / (step_ms x ratio)."""
    trees: list[Tree]
    total_tokens: int                  # N: tokens of the step's target forward
    expected_tokens: float             # sum of G_r over the requests
    step_ms: float | None              # predicted target + draft time (None: not measured)
    tokens_per_second: float | None
    ratio: float = 1.0                 # the step-time correction of its kind (StepCosts)

    @property
    def speculative(self) -> bool:
        """Whether any request got a tree (the draft runs)."""
        return any(len(tree) > 1 for tree in self.trees)


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
    max_total: tokens one decode may carry (n_batch); costs: the live step-time correction
    (a fresh StepCosts by default)."""

    def __init__(self, profile: Profile, max_budget: int = 16, max_depth: int = 8,
                 max_leaves: int = 16, max_total: int = 512, speculate: bool = True,
                 costs: StepCosts | None = None):
        for value, what in ((max_budget, "max_budget"), (max_depth, "max_depth"),
                            (max_leaves, "max_leaves"), (max_total, "max_total")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RedwoodError(f"{what} must be a positive integer, got {value!r}")
        self.profile = profile
        self.max_budget = max_budget if speculate else 1
        self.max_depth, self.max_leaves, self.max_total = max_depth, max_leaves, max_total
        self.costs = costs if costs is not None else StepCosts()
        self._options: dict[tuple, _Options] = {}
        self._plans: dict[tuple, BatchPlan] = {}
        self._last: tuple | None = None      # (ps, lags, ratios, plan) of the last plan() call

    @property
    def max_nodes(self) -> int:
        """The most nodes a request's tree may have (KV cells it may hold beyond its text)."""
        return self.max_budget

    def plan(self, ps: list, lags: list | None = None) -> BatchPlan:
        """Trees for requests with acceptance vectors `ps` (one per live request); lags[r]:
        tokens request r's draft must catch up on before it can draft (None: all 0)."""
        lags = [0] * len(ps) if lags is None else [min(MAX_LAG, max(0, int(x))) for x in lags]
        ratios = self.costs.quantised()            # (speculative, plain): part of the key
        last = self._last                          # most steps ask what the last one asked
        if last is not None and last[0] == ps and last[1] == lags and last[2] == ratios:
            return last[3]
        asked = (list(ps), lags, ratios)
        keys = [(tuple(round(float(x), 6) for x in p), lag) for p, lag in zip(ps, lags)]
        if not keys:
            return BatchPlan([], 0, 0.0, None, None)
        order = sorted(range(len(keys)), key=lambda i: keys[i])
        composition = tuple(keys[i] for i in order)
        plan = self._plans.get((composition, ratios))
        if plan is None:
            if len(self._plans) >= 1024:
                self._plans.clear()
            plan = self._plans[composition, ratios] = self._allocate(composition, ratios)
        trees = [None] * len(keys)
        for slot, i in enumerate(order):
            trees[i] = plan.trees[slot]
        answer = BatchPlan(trees, plan.total_tokens, plan.expected_tokens, plan.step_ms,
                           plan.tokens_per_second, plan.ratio)
        self._last = (*asked, answer)
        return answer

    def observe(self, plan: BatchPlan, seconds: float) -> None:
        """A step run as `plan` took `seconds` (the scheduler reports only steps whose time
        is what the plan predicted: no prompt or catch-up chunks)."""
        self.costs.record(plan.speculative, plan.step_ms, seconds)

    def _options_for(self, key: tuple) -> _Options:
        if key not in self._options:
            if len(self._options) >= 4096:          # live vectors drift: bound the cache
                self._options.clear()
            budget = self.max_budget if any(x > 0 for x in key) else 1
            self._options[key] = _Options(key, budget, self.max_depth, self.max_leaves)
        return self._options[key]

    def _allocate(self, keys: tuple, ratios: tuple) -> BatchPlan:
        options = [self._options_for(p) for p, _ in keys]
        lags = [lag for _, lag in keys]
        budgets = [1] * len(keys)
        # plain batched decoding, rated with the plain steps' correction: the yardstick
        best = self._evaluate(options, budgets, lags, ratios)
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
            candidate = self._evaluate(options, budgets, lags, ratios)
            rate = candidate.tokens_per_second
            if rate is not None and (best.tokens_per_second is None
                                     or rate > best.tokens_per_second):
                best, best_budgets = candidate, list(budgets)
            elif rate is not None and rate < 0.5 * best.tokens_per_second:
                break          # marginal gains only shrink: far below the best, it never returns
        if best.tokens_per_second is None:           # nothing measured: plain batched decoding
            best_budgets = [1] * len(keys)
        return self._evaluate(options, best_budgets, lags, ratios)

    def _evaluate(self, options: list[_Options], budgets: list[int], lags: list[int],
                  ratios: tuple) -> BatchPlan:
        """The allocation's plan, its rate from the predicted ms x its kind's ratio."""
        trees = [opt.trees[n] for opt, n in zip(options, budgets)]
        total = sum(budgets)
        expected = sum(opt.values[n] for opt, n in zip(options, budgets))
        ratio = ratios[0] if total > len(budgets) else ratios[1]    # any tree: speculative
        target = self.profile.target_ms.get(total)
        draft = self._draft_ms(options, budgets, lags)
        if target is None or draft is None:
            return BatchPlan(trees, total, expected, None, None, ratio)
        step = target + draft
        return BatchPlan(trees, total, expected, step, 1000.0 * expected / (step * ratio), ratio)

    def _draft_ms(self, options: list[_Options], budgets: list[int],
                  lags: list[int]) -> float | None:
        """One draft forward per level across requests; a level's width is the sum of the
        requests' widths there (the draft cost of design §3, summed over the batch), the first
        level's plus the lag tokens of the requests that draft."""
        widths: list[int] = []
        for opt, n, lag in zip(options, budgets, lags):
            for level, width in enumerate(opt.levels[n]):
                if level == len(widths):
                    widths.append(0)
                widths[level] += width + (lag if level == 0 else 0)
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
        self.costs = None             # no step-time correction: nothing is planned

    @property
    def max_nodes(self) -> int:
        return len(self.tree)

    def observe(self, plan: BatchPlan, seconds: float) -> None:
        """Nothing to learn: the tree is fixed."""

    def plan(self, ps: list, lags: list | None = None) -> BatchPlan:
        if len(self.tree) * len(ps) > self.max_total:
            raise RedwoodError(f"{len(ps)} trees of {len(self.tree)} nodes exceed one decode of "
                               f"{self.max_total} tokens; use a smaller tree or max_batch")
        # A request that does not speculate (acceptance all 0: autoregressive) gets the root.
        trees = [self.tree if any(float(x) > 0 for x in p) else ROOT_ONLY for p in ps]
        return BatchPlan(trees, sum(len(t) for t in trees), float("nan"), None, None)

