"""`NgramDrafter`: free drafts from the text itself (n-gram / prompt lookup), sized by a cost model.

Each step the drafter looks up what followed earlier occurrences of the current suffix
(`NgramIndex`), merges those continuations into a trie, and proposes the part of the trie that
pays for itself. The proposals are deterministic: every node is a point mass (q = δ_token), so
the verifier accepts a node with probability p(token) and stays exact (docs/design.md §4.5).
No model runs: draft_forwards is 0.

Why a cost model: a draft costs nothing to make but its tokens cost target time to check. On a
CPU, llama.cpp's t(n) is steep (t(2) ≈ 1.5 t(1), docs/design.md §5.3), so a draft that is
rejected slows decoding down; always drafting whenever something matches (llama-cpp-python's
prompt lookup) was slower than plain decoding. The drafter therefore estimates each node's
chance of acceptance and keeps the tree size n that maximises expected tokens per second,
E(n) / t(n) (the hardware-aware choice of §3 applied per step, with a free draft):

- c(v) = P(v accepted | its parent accepted and its earlier siblings rejected), read from an
  `AcceptanceModel` keyed by (greedy, match-length bucket, depth, rank);
- value(v) = value(parent) · Π_{earlier siblings j} (1 − c(j)) · c(v), root 1 (the
  unconditional path probability, as in §2.1);
- nodes are taken best-first by value, each only after its parent and its earlier siblings
  (so every prefix is a tree whose ranks are the trie's); E(n) = 1 + Σ value over the first
  n − 1 taken nodes (the 1 is the bonus token);
- n is the measured size (target_ms keys, never interpolated, §3) that maximises
  E(n) / target_ms[n], ties to the smaller n; n = 1 is a plain target step. With a by-context
  table (the profile's target_ms_by_context) t(n) is read at the request's context, re-read
  every CONTEXT_BUCKET tokens: at 2,000 tokens a tree node costs more than at 128.

Learning without wasting target time: for a point mass x at a node the target reached,
P(x accepted) = p(x) = P(the target's next token is x), and after rejecting x_1..x_{k-1} the
rule of §4.5 gives P(x_k accepted) = p(x_k) / (1 − Σ p(x_j)) = P(next token is x_k | it is none
of x_1..x_{k-1}). So walking the previous step's *whole* trie along the tokens actually emitted
(accepted path + bonus) gives unbiased acceptance observations for every node reached, drafted
or not. The model keeps learning even while it proposes nothing, and the trie never depends on
the target's output at its nodes, so exactness is untouched. Earlier steps' tries are walked
on along the text that follows them too (up to MAX_WALKS at once, each until the text leaves
it): a drafter that proposes 4-node chains emits at most 4 tokens a step, so walking only the
last trie would never observe a node at depth 5 or more, and a pessimistic estimate there
would stay as it was while the text copies on for hundreds of tokens (the drafter stuck at
short chains on a verbatim copy: an exploration trap).

Whole drafts are calibrated as well: each step's path values are scaled by the draft ratio,
kept / predicted over the trees the unscaled estimates chose on earlier steps, drafted or not
(decode/ngram_shadow.py, decode/ngram_acceptance.py), before the size is chosen.

Edits: a `CopyTracker` (decode/ngram_edits.py) follows where the text copies from; lookups
rank occurrences there first and offer each continuation also with the text's edits so far
applied (docs/design.md §3.3). It reads the emitted text only.

Across requests: with an `NgramMemory` (decode/ngram_memory.py) each lookup also ranks what
followed the suffix in earlier requests' generated text, and `finish()` adds this request's
(docs/design.md §3.3). The memory changes only between requests, so proposals stay point masses
fixed before verification.
"""
from __future__ import annotations

import time

import torch

from redwood.decode.drafter import ChildChooser, Proposal
from redwood.decode.layout import LayoutCache, TreeLayout
from redwood.decode.ngram_acceptance import (LONG_DRAFT_TOKENS, MATCH_LABELS, AcceptanceModel,
                                              RequestEstimates, node_bucket)
from redwood.decode.ngram_edits import CopyTracker
from redwood.decode.ngram_index import Continuation, NgramIndex
from redwood.decode.ngram_trie import TrieNode, build_trie
from redwood.decode.ngram_memory import NgramMemory, merge_continuations
from redwood.decode.ngram_shadow import ShadowDrafts
from redwood.decode.ngram_trees import best_first, bfs_subtree, tree_limits
from redwood.errors import RedwoodError
from redwood.plan.formats import check_times_by_context, interpolate_by_context
from redwood.plan.live_costs import CONTEXT_BUCKET     # the same grid as LiveCosts.follow
from redwood.plan.tree import Tree

# Longest chain a copy may draft: long copies pay only past the steep part of llama.cpp's cost
# curve on a CPU (t(8) > 2 t(4) but t(16) < 1.3 t(8) on a 2-core EPYC); an 8-token cap
# stopped short of it. Each step is still sized by E(n) / t(n).
COPY_DEPTH = 32
MAX_WALKS = 16      # earlier steps' tries followed along the text at once (module doc)
# A tree must be predicted this much faster than a plain step to be drafted: its E(n) rests on
# acceptance estimates that are off by more than that on prompts unlike the calibration's
# (a short match in chat kept 0.57 where the prior said 0.8), and on a steep CPU a step that
# keeps less than predicted loses outright (t(4) = 2.8 t(1)). The policy replay on this
# machine's costs (benchmarks/copy_ceiling.py) put the worst chat/HumanEval prompt at 0.96x
# without it and 0.98x with it, whole-file edits at 79 % and 78 % of the ceiling's gain.
DRAFT_MARGIN = 0.1


class NgramDrafter:
    """Drafter protocol (redwood.decode.drafter) over an `NgramIndex` of the text so far.

    target_ms: a profile's target forward time by tree size (root included), {1: t1, ...};
    None = every size up to the engine's tree budget costs the same (a flat, GPU-like curve:
    then the whole useful trie is proposed, up to the budget). learn: update the acceptance
    model from the emitted text (off = keep the priors: proposals depend on the text only).
    Proposals never exceed the requested tree's node count, leaf count or depth, so whatever
    the engine checked against the backend's limits (check_tree) also holds for them.
    target_ms_by_context: the profile's {context: {n: ms}} (Profile.target_ms_by_context);
    given, each step's t(n) is that table at the request's context (prompt + generated so far),
    interpolated per CONTEXT_BUCKET tokens (target_ms then only says that a profile exists).

    memory: an `NgramMemory` of earlier requests' generated text (decode/ngram_memory.py),
    shared across requests and settable; None = lookups see the current request only. With
    it, each lookup also ranks what followed the suffix in earlier answers, and `finish()`
    stores this request's generated text there. use_memory: the request's opt-out (set it
    before prefill, as the engine sets a request's settings): False = this request neither
    drafts from the memory nor is stored in it.
    """

    def __init__(self, target_ms: dict[int, float] | None = None, min_n: int = 1, max_n: int = 6,
                 max_continuations: int = 8, max_length: int = 8, max_occurrences: int = 32,
                 model: AcceptanceModel | None = None, learn: bool = True, clock=time.perf_counter,
                 memory: NgramMemory | None = None,
                 target_ms_by_context: dict | None = None, margin: float = DRAFT_MARGIN):
        if not 0 <= margin < 10:
            raise RedwoodError(f"NgramDrafter margin must be in [0, 10), got {margin}")
        self.margin = float(margin)
        self.target_ms = _check_target_ms(target_ms)
        self.target_ms_by_context = None if target_ms_by_context is None else \
            check_times_by_context(target_ms_by_context, "NgramDrafter")
        self._context_ms: tuple[int, dict[int, float]] | None = None   # (bucket, its t(n))
        self.ngram = dict(min_n=min_n, max_n=max_n, max_occurrences=max_occurrences)
        NgramIndex(**self.ngram)                           # validate now, not at prefill
        self.max_continuations, self.max_length = int(max_continuations), int(max_length)
        self.model = model or AcceptanceModel()
        self.learn, self.clock = learn, clock
        self.costs = None          # plan.live_costs.LiveCosts of the running request (the engine's)
        self.layouts: LayoutCache | None = None
        self.memory, self.use_memory = memory, True
        self.copy = CopyTracker()
        self._finished, self._store_on_finish = True, False     # no request to store yet
        self.prefill(torch.empty(0, dtype=torch.long))

    @property
    def sizes_itself(self) -> bool:
        """With a cost model every step's size is chosen on this machine's (live) costs, n = 1
        being a plain step, so the engine lets it decide instead of a governor."""
        return self.target_ms is not None or self.target_ms_by_context is not None

    # -- Drafter protocol ------------------------------------------------------------------
    def prefill(self, prompt_ids: torch.Tensor) -> None:
        """Start a request. The previous one is finished first if nobody called finish(), so
        its text reaches the memory all the same (under the opt-out it started with)."""
        self._finish(self._store_on_finish)
        self.index = NgramIndex(**self.ngram)
        prompt = torch.as_tensor(prompt_ids).reshape(-1).tolist()
        self.index.extend(prompt)
        self._generated_from = len(self.index)                  # index.tokens[this:]: its output
        self.index.prompt_end = self._generated_from
        self._finished, self._store_on_finish = False, bool(self.use_memory)
        self._last: tuple[list[TrieNode], bool] | None = None   # previous step's (trie, greedy)
        self._walks: list[list] = []           # [trie, greedy, node]: tries still on the text
        self.copy.reset()
        self._accepted: list[int] = []                           # its accepted tokens
        self._proposed: list[int] = []                           # its proposed trie nodes
        self._open = False                                       # proposed, not yet committed
        # this request's proposed drafts by match length: label -> [accepted, proposed]
        self.match_counts: dict[str, list[int]] = {}
        # the model as this request learns it, in the pool of its kind of prompt
        self.estimates = RequestEstimates(self.model.pool_for(prompt))
        self.shadows = ShadowDrafts(self.estimates.observe_draft)
        self._scaled: tuple | None = None     # the last scaling lookup's (greedy, predicted)

    def propose(self, root: int, layout: TreeLayout, choose: ChildChooser,
                min_confidence: float = 0.0) -> Proposal:
        """The part of the n-gram trie below `root` that maximises E(n) / t(n), within the
        requested tree's limits. min_confidence > 0 also drops nodes whose estimated
        acceptance c is below it (a drafter-side number: exactness is kept)."""
        start = self.clock()
        limits = tree_limits(layout.tree)
        trie, taken, values = self.lookup(root, limits, bool(choose.greedy), min_confidence)
        n, _ = self.best_size(values, limits[0])
        proposal = self.proposal(trie, taken[:n - 1], layout, self.clock() - start)
        proposal.expected_tokens = 1.0 + sum(values[:n - 1])
        return proposal

    def lookup(self, root: int, limits: tuple[int, int, int], greedy: bool,
               min_confidence: float = 0.0, alone: bool = True):
        """One step's lookup: learn from the previous step, append `root`, build the trie and
        take its nodes best-first within `limits` (nodes, leaves, depth). Returns (trie, taken
        node ids, their path values); the caller proposes a prefix of `taken` and commits.

        alone: the caller sizes the tree with best_size (on this drafter's costs), so nodes no
        size could pay for on those costs are not taken (ngram_trees.could_pay): on most chat
        steps that leaves a few nodes to estimate instead of the whole budget's 40. False (a
        batch sizing several requests' trees jointly, on other costs): take them all."""
        if self._open:
            raise RedwoodError("NgramDrafter.propose called twice without commit")
        root = int(root)
        self._learn_from_last(root)
        self.index.append(root)
        self.copy.step(self.index)
        trie = build_trie(root, self.candidates(min(self.max_length, limits[2])), lazy=True)
        # a root alone has no walk to stop: its bound is not worth building
        pays = self._pays(greedy, limits[0]) if alone and len(trie) > 1 else None
        taken, values = best_first(
            trie, lambda u: self.estimates.rate(self.model.key(greedy, trie[u])), limits,
            min_confidence, pays)
        if self.learn:                  # whole drafts calibrated (decode/ngram_shadow.py)
            n, _ = self.best_size(values, limits[0], margin=0.0)     # the unscaled choice
            predicted = sum(values[:n - 1])
            self.shadows.add(trie, greedy, taken[:n - 1], predicted)
            scale = self.estimates.draft_ratio(greedy, predicted)
            values = [v * scale for v in values]
            self._scaled = (greedy, predicted)
        self._last, self._accepted, self._open = (trie, greedy), [], True
        self._proposed = []
        if self.learn and len(trie) > 1:
            keep = max(0, len(self._walks) - MAX_WALKS + 1)
            self._walks = self._walks[keep:] + [[trie, greedy, 0]]
        return trie, taken, values

    def proposal(self, trie: list[TrieNode], keep: list[int], layout: TreeLayout,
                 seconds: float) -> Proposal:
        """The root plus the trie nodes `keep` (closed under parents), all point masses."""
        parents, order = bfs_subtree(trie, set(keep))
        device = layout.depths.device
        if self.layouts is None or self.layouts.device != device:
            self.layouts = LayoutCache(device)
        out = layout if parents == layout.tree.parents else self.layouts(
            Tree(parents, {"kind": "ngram", "from": len(layout.tree)}))
        self._proposed = order[1:]
        tokens = torch.tensor([trie[u].token for u in order], dtype=torch.long, device=device)
        point_mass = torch.ones(len(order), dtype=torch.bool, device=device)
        point_mass[0] = False                                     # the root is not proposed
        return Proposal(tokens, None, out, point_mass, seconds, 0,
                        sources=["root"] + ["ngram"] * (len(order) - 1))

    def commit(self, path: list[int], tokens: torch.Tensor) -> None:
        """Append the accepted tokens (the root was appended by propose) to the index."""
        self.commit_tokens([int(tokens[i]) for i in path[1:]])

    def commit_tokens(self, accepted: list[int]) -> None:
        """The target accepted these drafted tokens after this step's root."""
        self.index.extend(accepted)
        self._accepted, self._open = list(accepted), False
        if self._proposed:
            self._count_by_match(accepted)

    def draft_ratio(self) -> float | None:
        """The scale this request's last lookup would apply now (decode/ngram_shadow.py):
        kept / predicted drafted tokens, its own shadows on the pool's; None before any
        lookup, and without learning (no scale is applied then)."""
        return None if self._scaled is None else self.estimates.draft_ratio(*self._scaled)

    def withdraw(self) -> None:
        """The last proposal is not run (the caller found no room for it): it counts in no
        match-length figure; commit_tokens([]) then closes the step as a plain one."""
        self._proposed = []

    def _count_by_match(self, accepted: list[int]) -> None:
        """match_counts: each proposed node counts as proposed under its match length, and
        as accepted when it is on the path of accepted tokens."""
        trie, on_path, at = self._last[0], set(), 0
        for token in accepted:
            at = next((c for c in trie[at].children if trie[c].token == token), None)
            if at is None:
                break
            on_path.add(at)
        for u in self._proposed:
            counts = self.match_counts.setdefault(MATCH_LABELS[node_bucket(trie[u])], [0, 0])
            counts[0] += u in on_path
            counts[1] += 1

    def skip(self, root: int) -> None:
        """A plain target step consumed `root` (no proposal, decode/governor.py): learn from
        the previous trie, append `root`; no lookup, so the plain step stays plain."""
        if self._open:
            raise RedwoodError("NgramDrafter.skip called between propose and commit")
        self._learn_from_last(int(root))
        self.index.append(int(root))
        self.copy.step(self.index)
        self._last, self._accepted = None, []

    def candidates(self, max_length: int) -> list[Continuation]:
        """This step's continuations of the suffix: the request's own text, merged with the
        memory's when there is one and the request uses it (the request's first on ties)."""
        ours = self.index.candidates(self.max_continuations, max_length, self.copy.near())
        ours = self.copy.with_edits(self.index.tokens, ours, max_length)[:self.max_continuations]
        if self.memory is None or not self.use_memory:
            return ours
        suffix = self.index.tokens[-self.memory.max_match:]
        theirs = self.memory.candidates(suffix, self.max_continuations, max_length)
        return merge_continuations(ours, theirs, self.max_continuations)

    def finish(self) -> None:
        """The request ended: store its generated text in the memory, once. That text is
        everything committed after the prompt: the roots and the accepted tokens (the prompt's
        last token too where the engine fuses the prefill: there the first root is that token);
        the final bonus token is never committed, so it is not stored. Nothing is stored without a memory or
        when the request opted out (use_memory False at its prefill or now)."""
        self._finish(self._store_on_finish and self.use_memory)

    # -- internals -------------------------------------------------------------------------
    def _finish(self, store: bool) -> None:
        if self._finished:
            return
        self._finished = True
        if store and self.memory is not None:
            self.memory.add(self.index.tokens[self._generated_from:])
        if self.learn:
            self.model.request_done()

    def _learn_from_last(self, root: int) -> None:
        """Walk every trie still on the text (the previous step's and earlier ones, module
        doc) along what was emitted since the previous step's root: its accepted tokens, then
        the bonus, which is this step's root. At each node reached, the children before the one
        that matches were rejected, the match was accepted; a walk ends where the text leaves
        its trie or the trie ends."""
        if not self.learn:
            return
        tokens = self._accepted + [root]
        self._walks = [walk for walk in self._walks if self._walk_on(walk, tokens)]
        self.shadows.follow(tokens)

    def _walk_on(self, walk: list, tokens: list[int]) -> bool:
        """Advance one walk [trie, greedy, node] along `tokens`, observing every child tried;
        whether it is still on the text with children to try."""
        trie, greedy, at = walk
        for token in tokens:
            match = None
            for child in trie[at].children:
                hit = trie[child].token == token
                self.estimates.observe(self.model.key(greedy, trie[child]), hit)
                if hit:
                    match = child
                    break
            if match is None:
                return False
            at = match
        walk[2] = at
        return bool(trie[at].children)

    def best_size(self, values: list[float], max_nodes: int,
                  margin: float | None = None) -> tuple[int, float]:
        """(n, E(n) / t(n)) at the argmax over measured n <= max_nodes; ties to the smaller n;
        a tree predicted less than `margin` (DRAFT_MARGIN) faster than a plain step gives n = 1.
        t(n) is the profile's at this context (step_target_ms); with live costs from the
        engine (plan/live_costs.py, rebased on the profile at the request's context as it
        grows) it is their corrected figure. Without target_ms every size costs 1."""
        expected, best_n, best = 1.0, 1, None
        sizes = self._cost_table(max_nodes)
        for n in range(1, min(max_nodes, len(values) + 1) + 1):
            expected += values[n - 2] if n > 1 else 0.0
            if n in sizes:
                rate = expected / sizes[n]
                if best is None or rate > best:
                    best_n, best = n, rate
        margin = self.margin if margin is None else margin
        if self.sizes_itself and best_n > 1 and 1 in sizes and best < (1 + margin) / sizes[1]:
            return 1, 1.0 / sizes[1]          # not clearly faster than plain (DRAFT_MARGIN)
        return best_n, best

    def _cost_table(self, max_nodes: int) -> dict[int, float]:
        """{n: ms} best_size weighs: the live costs where the engine keeps them (on the profile
        at this context), else the profile's at this context, else 1 for every size."""
        if not self.sizes_itself:
            return {n: 1.0 for n in range(1, max_nodes + 1)}
        if self.costs is not None:
            return self.costs.table()
        return self.step_target_ms()

    def _pays(self, greedy: bool, max_nodes: int):
        """best_first's `pays` for this step (ngram_trees.could_pay): the sizes best_size may
        choose, as t(n) / t(1) - 1, and the largest scale it may apply to the values (the
        draft ratio of either class, or 1 for the unscaled choice). None without a cost model:
        every size costs the same, so every node pays."""
        if not self.sizes_itself:
            return None
        table = self._cost_table(max_nodes)
        if 1 not in table:
            return None
        one = table[1]
        sizes = sorted((n, t / one - 1.0) for n, t in table.items() if 1 < n <= max_nodes)
        scale = 1.0
        if self.learn:
            scale = max(scale, self.estimates.draft_ratio(greedy, 0.0),
                        self.estimates.draft_ratio(greedy, LONG_DRAFT_TOKENS))
        return sizes, scale

    def step_target_ms(self) -> dict[int, float] | None:
        """The profile's t(n) for this step: the by-context table at the request's context
        (len(index) tokens), recomputed only when the context enters a new CONTEXT_BUCKET so
        the per-step cost is a dict lookup; else target_ms."""
        if self.target_ms_by_context is None:
            return self.target_ms
        bucket = len(self.index) // CONTEXT_BUCKET
        if self._context_ms is None or self._context_ms[0] != bucket:
            self._context_ms = (bucket, interpolate_by_context(
                self.target_ms_by_context, bucket * CONTEXT_BUCKET))
        return self._context_ms[1]


def _check_target_ms(target_ms) -> dict[int, float] | None:
    if target_ms is None:
        return None
    times = {int(n): float(t) for n, t in dict(target_ms).items()}
    if 1 not in times or any(n < 1 or not t > 0 for n, t in times.items()):
        raise RedwoodError("target_ms needs positive times by tree size n >= 1, including n = 1")
    return times
