"""Per-step trees grown best-first by calibrated path acceptance under this machine's costs.

`DraftModelDrafter` drafts level by level inside a maximal tree M (the request's tree). With a
`BestFirstGrowth`, each level decides, from draft-side numbers only (docs/design.md §3.5):

- how many of each expanding node's children to keep (a rank prefix of M's children), *before*
  they are drawn, from the node's own draft distribution: slot j of node u is worth
  value(u) · Π_{i<j} (1 − c(q_(i))) · c(q_(j)), q_(i) the i-th largest draft probability and
  c(·) the calibrated chance that the target accepts a drafted token of that probability
  (`redwood calibrate` records it as confidence bins; without them c(q) = q). Slots are taken
  best-first and the prefix that maximises the step's score is kept (below);
- which of the kept children get children of their own: the next draft forward over the set S
  costs draft_level(|S|) and ≥ |S| target rows. A child's best child is worth the child's
  value times the larger of `continuation` — the calibrated chance that a rank-1 draft token
  is accepted given its parent was (the bundle vector's p[0]) — and the child's own c(q) (a
  token the draft is sure of tends to be followed by one it is sure of). The prefix of
  children (by value) whose expansion scores best is expanded, none if no expansion raises
  the score. Nothing pays: the step drafts only the root's level. (Not the child's own c(q)
  alone: a token the draft hesitated on is followed by one the target accepts nearly as
  often as any other — on HumanEval at T 0, 62-77 % of the tokens after an accepted
  q < 0.6 token were accepted, against c(q) of 0.37-0.60 — and charging the hesitation
  twice stopped chains the target would have kept.)

The score of a step of E expected tokens costing C ms is E − R·C. R is the `bar` — the tokens
per ms this request's recent steps achieved (the engine sets it from the governor's live rate,
at least plain decoding's 1 / t_target(1)) — or the step's own rate so far where that is
lower. Maximising E − R·C over the long-run rate R is what maximises that rate (a renewal
argument: a step is worth taking further while its next level earns more per ms than steps
earn on average); maximising the step's own rate E / C instead stops a lucky step early (once
a confident chain has earned 10 expected tokens its own rate is above what one more level
adds, though that level still earns more than the request's average). The step's rate caps
R because each decision looks one level ahead: early in a step, the first child's share of
t_target(2) − t_target(1) must be amortised by levels not yet drafted.

Target costs between measured sizes are interpolated here (the profile measures every size
to 16, then 20, 24, 28, 32, 40, 48): taking the next measured size's time would charge a
whole jump to the one level that crosses it.

Why exact: the number of children of u is fixed before u's children are drawn (the first j
draws of a sequence without replacement are j sequential draws, so keeping a prefix of M's
draws is drawing j), and whether a node is expanded depends on its own token and the draft's
numbers, never on the target (the adaptive-pruning argument of §4.6); the bar depends only
on earlier steps' outcomes, fixed before this step's draws.

Pure python over small lists: no model, no torch in the decisions.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from redwood.decode.governor import measured_ms


@dataclass
class Calibration:
    """c(q): the chance the target accepts a drafted token the draft gave probability q, from
    confidence bins (edges, rates; None rates fall back to q itself)."""
    edges: list[float] = field(default_factory=lambda: [0.0, 1.0])
    rates: list[float | None] = field(default_factory=lambda: [None])

    def __call__(self, q: float) -> float:
        for b in range(len(self.rates)):
            if q < self.edges[b + 1] or b == len(self.rates) - 1:
                rate = self.rates[b]
                return float(q) if rate is None else float(rate)
        return float(q)

    @classmethod
    def from_bins(cls, bins) -> "Calibration":
        """From plan.formats.ConfidenceBins (bins with fewer than 8 drafted tokens: c = q)."""
        rates = [a / d if d >= 8 else None for a, d in zip(bins.accepted, bins.drafted)]
        return cls(list(bins.edges), rates)


def interpolated_ms(times: dict[int, float], n: int) -> float:
    """times {size: ms} at size n, linear between the measured sizes around it (scaled
    linearly beyond the largest, like governor.measured_ms)."""
    below = [s for s in times if s <= n]
    above = [s for s in times if s >= n]
    if not below or not above:
        return measured_ms(times, n)
    low, high = max(below), min(above)
    if low == high:
        return times[low]
    return times[low] + (times[high] - times[low]) * (n - low) / (high - low)


class BestFirstGrowth:
    """One request's growth rule. target_ms: {n: ms} (measured sizes); draft_level_ms:
    width -> ms of one draft forward over that many nodes."""

    def __init__(self, target_ms: dict[int, float], draft_level_ms, calibration=None,
                 continuation=None):
        """calibration: a Calibration, or temperature -> Calibration (then each step uses
        the one for its request's temperature, greedy = 0), or None (c(q) = q).
        continuation: P(a rank-1 draft token is accepted | its parent was), a number or
        temperature -> number; None: each node's own c(q) stands in for it."""
        self.target_ms = dict(target_ms)
        self.draft_level_ms = draft_level_ms
        self.calibration = calibration or Calibration()
        self.c = self.calibration if isinstance(self.calibration, Calibration) else None
        self.continuation = continuation
        self.next_c = continuation if not callable(continuation) else None
        self.bar = None                 # tokens per ms a step must earn; None: its own rate
        self.begin()

    def begin(self, temperature: float = 0.0) -> None:
        """A new step (at a request's temperature): the root alone, its first draft forward
        paid."""
        if not isinstance(self.calibration, Calibration):
            self.c = self.calibration(temperature)
        if callable(self.continuation):
            self.next_c = self.continuation(temperature)
        self.value = {0: 1.0}                   # node -> P(path to it accepted), estimated
        self.own = {0: 1.0}                     # node -> c of its own token (predictability)
        self.expected, self.nodes = 1.0, 1
        self.draft_ms = self.draft_level_ms(1)

    def cost(self, nodes: int, extra_draft_ms: float = 0.0) -> float:
        return interpolated_ms(self.target_ms, nodes) + self.draft_ms + extra_draft_ms

    def rate(self) -> float:
        return self.expected / self.cost(self.nodes)

    def scorer(self):
        """score(expected, cost_ms) for the decision at hand: the surplus E − R·C over
        R = min(bar, this step's rate so far) (module doc)."""
        rate = self.rate()
        bar = rate if self.bar is None else min(self.bar, rate)
        return lambda expected, cost_ms: expected - bar * cost_ms

    def child_counts(self, nodes: list[int], top_probs: list[list[float]],
                     limits: list[int]) -> list[int]:
        """How many children (rank prefix, at most limits[i]) node nodes[i] keeps, from its
        draft distribution's largest probabilities top_probs[i] (descending)."""
        heap = []
        for row, u in enumerate(nodes):
            if limits[row] > 0 and top_probs[row]:
                c = self.c(top_probs[row][0])
                heap.append((-self.value[u] * c, row, 0, self.value[u] * (1.0 - c)))
        heapq.heapify(heap)
        taken, expected, score_of = [], self.expected, self.scorer()
        best = (score_of(expected, self.cost(self.nodes)), 0)
        while heap:
            negative, row, j, miss = heapq.heappop(heap)
            taken.append(row)
            expected -= negative
            score = score_of(expected, self.cost(self.nodes + len(taken)))
            if score > best[0]:
                best = (score, len(taken))
            if j + 1 < min(limits[row], len(top_probs[row])):
                c = self.c(top_probs[row][j + 1])
                heapq.heappush(heap, (-miss * c, row, j + 1, miss * (1.0 - c)))
        counts = [0] * len(nodes)
        for row in taken[:best[1]]:
            counts[row] += 1
        return counts

    def add_children(self, parent: int, children: list[int], probs: list[float]) -> None:
        """Record the kept children of `parent` (rank order) with the draft probability of the
        token each one drew: their path values, and E."""
        miss = self.value[parent]
        for child, q in zip(children, probs):
            c = self.c(q)
            self.own[child] = c
            self.value[child] = miss * c
            self.expected += miss * c
            miss *= 1.0 - c
        self.nodes += len(children)

    def to_expand(self, candidates: list[int]) -> list[int]:
        """The children worth a next draft level (see the module doc); [] stops drafting."""
        ranked = sorted(candidates, key=lambda u: -self.value[u])
        score_of = self.scorer()
        best, best_k, gain = score_of(self.expected, self.cost(self.nodes)), 0, 0.0
        for k, u in enumerate(ranked, start=1):
            own = self.own[u] if self.next_c is None else max(self.next_c, self.own[u])
            gain += self.value[u] * own             # its best child's worth, estimated
            score = score_of(self.expected + gain,
                             self.cost(self.nodes + k, self.draft_level_ms(k)))
            if score > best:
                best, best_k = score, k
        return ranked[:best_k]

    def ran_level(self, width: int) -> None:
        self.draft_ms += self.draft_level_ms(width)
