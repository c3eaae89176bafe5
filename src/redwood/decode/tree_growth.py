"""Per-step trees grown best-first by calibrated path acceptance under this machine's costs.

`DraftModelDrafter` drafts level by level inside a maximal tree M (the request's tree). With a
`BestFirstGrowth`, each level decides, from draft-side numbers only (docs/design.md §3.5):

- how many of each expanding node's children to keep (a rank prefix of M's children), *before*
  they are drawn, from the node's own draft distribution: slot j of node u is worth
  value(u) · Π_{i<j} (1 − c(q_(i))) · c(q_(j)), q_(i) the i-th largest draft probability and
  c(·) the calibrated chance that the target accepts a drafted token of that probability
  (`redwood calibrate` records it as confidence bins; without them c(q) = q). Slots are taken
  best-first and the prefix that maximises E / (t_target(n) + draft ms so far) is kept;
- which of the kept children get children of their own: the next draft forward over the set S
  costs draft_level(|S|) and ≥ |S| target rows; a child's own calibrated acceptance stands in
  for how predictable its continuation is, so the prefix of children (by value) maximising
  (E + Σ value · c) / (t_target(n + |S|) + draft ms + draft_level(|S|)) is expanded, none if
  that does not beat the current rate. Nothing pays: the step drafts only the root's level.

Why exact: the number of children of u is fixed before u's children are drawn (the first j
draws of a sequence without replacement are j sequential draws, so keeping a prefix of M's
draws is drawing j), and whether a node is expanded depends on its own token and the draft's
numbers, never on the target (the adaptive-pruning argument of §4.6).

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


class BestFirstGrowth:
    """One request's growth rule. target_ms: {n: ms} (measured sizes); draft_level_ms:
    width -> ms of one draft forward over that many nodes."""

    def __init__(self, target_ms: dict[int, float], draft_level_ms, calibration=None):
        """calibration: a Calibration, or temperature -> Calibration (then each step uses
        the one for its request's temperature, greedy = 0), or None (c(q) = q)."""
        self.target_ms = dict(target_ms)
        self.draft_level_ms = draft_level_ms
        self.calibration = calibration or Calibration()
        self.c = self.calibration if isinstance(self.calibration, Calibration) else None
        self.begin()

    def begin(self, temperature: float = 0.0) -> None:
        """A new step (at a request's temperature): the root alone, its first draft forward
        paid."""
        if not isinstance(self.calibration, Calibration):
            self.c = self.calibration(temperature)
        self.value = {0: 1.0}                   # node -> P(path to it accepted), estimated
        self.own = {0: 1.0}                     # node -> c of its own token (predictability)
        self.expected, self.nodes = 1.0, 1
        self.draft_ms = self.draft_level_ms(1)

    def cost(self, nodes: int, extra_draft_ms: float = 0.0) -> float:
        return measured_ms(self.target_ms, nodes) + self.draft_ms + extra_draft_ms

    def rate(self) -> float:
        return self.expected / self.cost(self.nodes)

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
        taken, expected, best = [], self.expected, (self.rate(), 0)
        while heap:
            negative, row, j, miss = heapq.heappop(heap)
            taken.append(row)
            expected -= negative
            rate = expected / self.cost(self.nodes + len(taken))
            if rate > best[0]:
                best = (rate, len(taken))
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
        best, best_k, gain = self.rate(), 0, 0.0
        for k, u in enumerate(ranked, start=1):
            gain += self.value[u] * self.own[u]     # its best child's worth, estimated
            rate = (self.expected + gain) / self.cost(self.nodes + k, self.draft_level_ms(k))
            if rate > best:
                best, best_k = rate, k
        return ranked[:best_k]

    def ran_level(self, width: int) -> None:
        self.draft_ms += self.draft_level_ms(width)
