"""`HybridDrafter`: n-gram continuations and draft-model children in one tree per step.

Each step it looks the suffix up in the n-gram index (free) and compares, on this machine's
profile, the ways to spend the step (docs/design.md §3.4):
- n-gram only: the best prefix of the n-gram trie, E(n) / t(n) by the n-gram cost model
  (n = 1 is a plain target step);
- the draft model's tree with the n-gram trie grafted onto it: the model's live rate, tokens
  kept per predicted ms of its recent steps (a prior from the planner until it has run),
  decayed like the governor's (decode/governor.py).
The model runs only when its rate is the best, or as a probe after `probe_every` steps
without it (what it yields changes within a text). Its rate is measured, not predicted: a model
step costs what its draft forwards took (catching up on the tokens the n-gram steps accepted
included: after 8 steps of a copied file that is a 150-token draft forward) plus the target's
verify at the request's live cost. What the model must run before it can draft (the prompt, at
first; the tokens accepted since it last ran) is charged to it too, spread over CATCH_UP_STEPS
steps: on a 2-core CPU the draft prefills ~9 ms a token, so a pasted 700-token module costs
6 s before its first tree, more than the model can win back on an answer the n-gram side
copies (measured: 0.6x `--drafter ngram` on whole-file edits when the model ran anyway). A
probe is taken only where the model's planned rate, its catch-up included, would beat what the
n-gram side offers, and only once the model has run on its merits; one the n-gram side beat
doubles the wait before the next (8, 16, 32, 64 steps), a model step that wins resets it. Like
a tree over a plain step on the n-gram side, the model must be predicted DRAFT_MARGIN faster
than what it displaces (on one 2-core Xeon its plan read 1.11x plain before the prompt's
catch-up; its first tree on a chat prompt then cost 1.1 s and the request 1.3x the n-gram
drafter's time).

Merging, and why it stays exact: the model drafts its tree as usual; then the trie is walked
from the root. A trie child whose token equals a child the model proposed at the same node
becomes that node (its continuation is grafted below it); any other is appended after the
model's children as a point mass (q = δ_token). Every node is then verified under the law that
proposed it (sampled children first, in their draw order, so the verifier's contract for them
holds; docs/design.md §4.5). Which point masses are kept depends on the text and the draft's
draws only, never on the target, so the output law is the target's.
"""
from __future__ import annotations

import time

import torch

from redwood.decode.draft_model import DraftModelDrafter
from redwood.decode.drafter import ChildChooser, Proposal
from redwood.decode.governor import draft_level_ms, step_ms, target_ms
from redwood.decode.layout import LayoutCache, TreeLayout
from redwood.decode.ngram_drafter import COPY_DEPTH, NgramDrafter
from redwood.decode.ngram_trees import ngram_budget_tree, tree_limits
from redwood.errors import RedwoodError
from redwood.plan.tree import Tree, bfs_renumber

# A catch-up (the draft's forward over the prompt or over the tokens accepted while it did not
# run) must pay for itself within this many model steps: it is charged to the model's rate as
# catch-up ms / CATCH_UP_STEPS per step when deciding to run it. 16 steps is ~50 tokens of an
# answer, so a 256-token chat answer repays a short prompt's prefill, a copied module does not.
CATCH_UP_STEPS = 16


class HybridDrafter:
    """Drafter protocol (redwood.decode.drafter) over a draft model and an n-gram index.

    plans: temperature -> (the draft model's tree, its expected tokens per step[, mode]),
    planned for this machine (a request's temperature picks its plan at its first step; greedy
    = 0); the expectation is the live rate's prior, worth `prior_steps` steps. mode "hybrid"
    (default) weighs both sources each step; "ngram" never runs the model (the planner found
    no model tree that pays at that temperature: `--drafter auto`). profile: this machine's
    latency profile (plan.formats.Profile: target t(n), draft level costs). The engine's tree
    is the step's budget (hybrid_budget_tree): merged trees stay within its node count, leaf
    count and depth."""

    def __init__(self, model: DraftModelDrafter, ngram: NgramDrafter, profile, plans,
                 prior_steps: float = 2.0, decay: float = 0.8, probe_every: int = 8,
                 max_probe_every: int = 64, clock=time.perf_counter,
                 ngram_tree: Tree | None = None):
        if ngram.target_ms is None:
            raise RedwoodError("HybridDrafter needs an NgramDrafter with target_ms (the profile's)")
        self.model, self.ngram, self.profile, self.plans = model, ngram, profile, plans
        self.clock, self.prior_steps = clock, float(prior_steps)
        self.layouts = LayoutCache(model.backend.device)
        self.decay, self.probe_every = float(decay), int(probe_every)
        self.max_probe_every = max(int(max_probe_every), self.probe_every)
        self.costs = None        # plan.live_costs.LiveCosts of the running request (the engine's)
        # The n-gram side looks up and sizes within the limits `--drafter ngram` works in, not
        # the wider budget (model tree + n-gram budget), so a step the model sits out is the
        # n-gram drafter's step by construction: the budget's extra leaves and nodes let
        # best_first and best_size consider trees `--drafter ngram` never could.
        self.ngram_limits = tree_limits(ngram_tree or ngram_budget_tree(depth=ngram.max_length))
        self.prefill(torch.empty(0, dtype=torch.long))

    @property
    def sizes_itself(self) -> bool:
        """Every step is chosen here on live costs (the model's tree, an n-gram tree, or n = 1:
        a plain step), so the engine runs no governor over it: one would second-guess the n-gram
        side's plain steps from the drafter's history (measured: 169 plain steps where
        `--drafter ngram` took 148 and drafted more, 3 % slower on a HumanEval prompt)."""
        return self.ngram.sizes_itself

    # -- Drafter protocol ------------------------------------------------------------------
    def prefill(self, prompt_ids: torch.Tensor) -> None:
        # The draft model prefills only when the request's plan uses it (at the first step,
        # once the temperature is known): in "ngram" mode it never runs, so a request pays no
        # draft prefill (on a 2-core CPU 0.3 s for a chat prompt, 4.7 s for a pasted module).
        self._unprefilled = torch.as_tensor(prompt_ids).reshape(-1).tolist()
        self.model_ready = False
        self.ngram.prefill(prompt_ids)
        self.model_tree = None                          # the request's plan, at its first step
        self.without_model = 0                          # steps since the model last ran
        self.probe_interval = self.probe_every          # steps without it before a probe
        self.steps = {"model": 0, "ngram": 0, "plain": 0}
        self._step: tuple | None = None                 # (sources, model node ids) of the proposal
        self._ran_on_merit = False                      # probes only once it has

    def propose(self, root: int, layout: TreeLayout, choose: ChildChooser,
                min_confidence: float = 0.0) -> Proposal:
        start = self.clock()
        if self.model_tree is None:
            self._plan(0.0 if choose.greedy else choose.temperature)
        limits = tree_limits(layout.tree)
        own = tuple(min(a, b) for a, b in zip(self.ngram_limits, limits))
        if any(have > most for have, most in zip(tree_limits(self.model_tree), limits)):
            raise RedwoodError(
                f"the draft model's tree ({len(self.model_tree)} nodes) does not fit the request's "
                f"tree budget ({limits[0]} nodes, {limits[1]} leaves, depth {limits[2]}): the "
                "hybrid drafter runs with method sequoia on the tree hybrid_drafting returns")
        trie, taken, values = self.ngram.lookup(root, own, bool(choose.greedy), min_confidence)
        n, ngram_rate = self.ngram.best_size(values, own[0])
        use, probe = self._use_model(ngram_rate)
        if not use:
            self.without_model += 1
            self.steps["plain" if n == 1 else "ngram"] += 1
            proposal = self.ngram.proposal(trie, taken[:n - 1], layout, 0.0)
            proposal.expected_tokens = 1.0 + sum(values[:n - 1])     # as NgramDrafter predicts
            self._step = (proposal.sources, None)
            if self.model_ready:
                self.model.skip(int(root))        # the model runs it with its next draft
            else:
                self._unprefilled.append(int(root))
            proposal.draft_seconds = self.clock() - start
            return proposal
        self.without_model = 0
        self.steps["model"] += 1
        self._versus = (ngram_rate, probe)
        self._ran_on_merit = self._ran_on_merit or not probe
        if not self.model_ready:                        # the prompt, at its first use
            self.model.prefill(torch.tensor(self._unprefilled, dtype=torch.long))
            self.model_ready = True
        model_start = self.clock()
        drafted = self.model.propose(root, self.model_layout, choose, min_confidence)
        proposal = self._graft(drafted, trie, taken, values, limits, layout,
                               1000.0 * (self.clock() - model_start))
        proposal.draft_seconds = self.clock() - start
        return proposal

    def commit(self, path: list[int], tokens: torch.Tensor) -> None:
        sources, model_ids = self._step
        accepted = [int(tokens[u]) for u in path[1:]]
        self.ngram.commit_tokens(accepted)
        if model_ids is None:                          # n-gram or plain step: the model catches up
            if self.model_ready:
                self.model.pending.extend(accepted)
            else:
                self._unprefilled.extend(accepted)
        else:
            # the model's nodes are a prefix of the path (grafts have no model children)
            k = next((i for i, u in enumerate(path) if sources[u] == "ngram"), len(path))
            self.model.commit([model_ids[u] for u in path[:k]], self._model_tokens)
            self.model.pending.extend(accepted[k - 1:])
            self.model_kept = self.decay * self.model_kept + len(path)
            self.model_ms = self.decay * self.model_ms + self._step_ms
            self.model_weight = self.decay * self.model_weight + 1.0
            self._back_off(len(path) / self._step_ms)
        self._step = None

    def skip(self, root: int) -> None:
        """A plain target step (the engine's governor) consumed `root`."""
        self.ngram.skip(root)
        if self.model_ready:
            self.model.skip(root)
        else:
            self._unprefilled.append(int(root))

    # -- internals -------------------------------------------------------------------------
    def _plan(self, temperature: float) -> None:
        tree, tokens, *mode = self.plans(temperature)
        self.mode = mode[0] if mode else "hybrid"
        if self.mode not in ("hybrid", "ngram"):
            raise RedwoodError(f"unknown hybrid plan mode {self.mode!r}: hybrid or ngram")
        if not tokens >= 1.0:
            raise RedwoodError(f"the model plan's expected tokens per step must be >= 1, got "
                               f"{tokens}")
        self.model_tree = tree
        self.model_layout = self.layouts(tree)
        # the plan's step: the target over the tree, the draft over every level with children
        self.plan_kept, self.plan_ms = float(tokens), step_ms(self.profile, tree,
                                                              tree.num_levels - 1)
        self.model_kept = self.plan_kept * self.prior_steps        # decayed tokens kept
        self.model_ms = self.plan_ms * self.prior_steps            # decayed ms of those steps
        self.model_weight = self.prior_steps                       # decayed steps

    def _use_model(self, ngram_rate: float) -> tuple[bool, bool]:
        """(run the model this step, as a probe: its own rate would not have)."""
        if self.mode == "ngram":
            return False, False
        # the n-gram side's own rule for a tree over a plain step (DRAFT_MARGIN): the model
        # must be predicted clearly faster than what it displaces, predictions being that rough
        bar = ngram_rate * (1.0 + self.ngram.margin)
        catch_up = self._catch_up_ms() / CATCH_UP_STEPS            # per step, spread
        if self.model_kept / (self.model_ms + catch_up * self.model_weight) > bar:
            return True, False
        probe = (self._ran_on_merit and self.without_model >= self.probe_interval
                 and self.plan_kept / (self.plan_ms + catch_up) > bar)
        return probe, probe

    def _catch_up_ms(self) -> float:
        """What the draft must run before its next tree beyond the root's own forward: the
        prompt and what was accepted since (not prefilled yet), else its pending tokens."""
        behind = len(self.model.pending) if self.model_ready else len(self._unprefilled)
        if behind == 0:
            return 0.0
        return draft_level_ms(self.profile, behind + 1) - draft_level_ms(self.profile, 1)

    def _back_off(self, step_rate: float) -> None:
        """After a model step: a probe that kept fewer tokens per measured ms than the n-gram
        side offered doubles the wait for the next (up to max_probe_every); a model step that
        beat it, probe or not, resets the wait."""
        ngram_rate, probe = self._versus
        if step_rate >= ngram_rate:
            self.probe_interval = self.probe_every
        elif probe:
            self.probe_interval = min(2 * self.probe_interval, self.max_probe_every)

    def _target_ms(self, n: int) -> float:
        """The target's verify forward over n nodes: the request's live cost, else the profile's."""
        return self.costs.target_ms(n) if self.costs is not None else target_ms(self.profile, n)

    def _graft(self, drafted: Proposal, trie, taken, values, limits, layout,
               model_ms: float) -> Proposal:
        """The model's tree plus the n-gram nodes worth their rows (see module doc). model_ms:
        what the model's drafting took (its catch-up included), charged to the step."""
        parents = list(drafted.layout.tree.parents)
        tokens = drafted.tokens.tolist()
        sources = ["root"] + ["model"] * (len(parents) - 1)
        kids = [dict() for _ in parents]                   # node -> {token: child node}
        for v in range(1, len(parents)):
            kids[parents[v]].setdefault(tokens[v], v)
        leaves = sum(1 for k in kids if not k)
        at = {0: 0}                                        # trie node -> tree node
        depths = [int(d) for d in drafted.layout.tree.depths]
        cost = self._cost(model_ms)
        expected = self.model_kept / self.model_ms * cost(len(parents))
        best = (expected / cost(len(parents)), len(parents))
        for node, value in zip(taken, values):
            item = trie[node]
            parent = at.get(item.parent)
            if parent is None:
                break
            merged = kids[parent].get(item.token)
            if merged is not None:
                at[node] = merged
                continue
            widens = bool(kids[parent])                   # a new sibling is a new leaf
            if len(parents) >= limits[0] or depths[parent] + 1 > limits[2] or \
                    leaves + widens > limits[1]:
                break
            leaves += widens
            parents.append(parent)
            tokens.append(item.token)
            sources.append("ngram")
            depths.append(depths[parent] + 1)
            kids.append({})
            kids[parent][item.token] = at[node] = len(parents) - 1
            expected += value
            rate = expected / cost(len(parents))
            if rate > best[0]:
                best = (rate, len(parents))
        self._step_ms = cost(best[1])
        merged = self._merged(drafted, parents[:best[1]], tokens[:best[1]], sources[:best[1]],
                              layout)
        # the prediction the choice was made on: the model's live rate over this step's cost
        # plus the grafted nodes' values
        merged.expected_tokens = best[0] * self._step_ms
        return merged

    def _cost(self, model_ms: float):
        """n -> ms of this step with n tree nodes: the draft's measured, the verify's live."""
        return lambda n: self._target_ms(n) + model_ms

    def _merged(self, drafted: Proposal, parents, tokens, sources, layout) -> Proposal:
        """Renumber breadth-first (model children before grafts) and build the Proposal."""
        new_parents, order = bfs_renumber(parents)
        tree = Tree(new_parents, {"kind": "hybrid", "from": len(layout.tree)})
        device = drafted.tokens.device
        model_nodes = len(drafted.layout.tree)
        probs = None
        if drafted.draft_probs is not None:
            probs = drafted.draft_probs.new_zeros((len(order), drafted.draft_probs.shape[-1]))
            rows = [i for i, u in enumerate(order) if u < model_nodes]
            probs[rows] = drafted.draft_probs[[order[i] for i in rows]]
        new_sources = [sources[u] for u in order]
        self._step = (new_sources, [u if u < model_nodes else None for u in order])
        self._model_tokens = drafted.tokens
        return Proposal(torch.tensor([tokens[u] for u in order], dtype=torch.long, device=device),
                        probs, self.layouts(tree),
                        torch.tensor([s == "ngram" for s in new_sources], dtype=torch.bool,
                                     device=device),
                        0.0, drafted.draft_forwards, sources=new_sources)


def hybrid_budget_tree(model_trees: list[Tree], ngram_tree: Tree) -> Tree:
    """The engine's tree for a hybrid drafter: a tree with as many nodes and leaves as the
    largest model tree and the n-gram budget side by side under one root, and as deep as the
    deepest of them. Its node count, leaf count and depth bound every merged tree; the
    backends check them before the first step. Only those three numbers matter."""
    leaves = lambda t: sum(1 for kids in t.children if not kids)     # noqa: E731
    nodes = max(len(t) for t in model_trees) + len(ngram_tree) - 1
    width = max(leaves(t) for t in model_trees) + leaves(ngram_tree)
    depth = max(t.num_levels for t in model_trees + [ngram_tree]) - 1
    return limits_tree(nodes, width, depth)


def limits_tree(nodes: int, leaves: int, depth: int) -> Tree:
    """A tree with `leaves` leaves, `depth` edges deep and max(nodes, depth + leaves) nodes:
    one chain `depth` deep, `leaves - 1` side branches from the root, the remaining nodes
    lengthening the side branches in turn (each at most `depth` deep)."""
    if nodes < 1 or leaves < 1 or depth < 0:
        raise RedwoodError(f"bad tree limits: {nodes} nodes, {leaves} leaves, depth {depth}")
    if depth == 0:
        return Tree([-1])
    parents = [-1] + list(range(depth))                      # the main chain
    tips = []
    for _ in range(leaves - 1):
        parents.append(0)
        tips.append([len(parents) - 1, 1])                    # [tip node, its depth]
    growing = [tip for tip in tips if tip[1] < depth]
    while len(parents) < nodes and growing:
        for tip in growing:
            if len(parents) >= nodes:
                break
            parents.append(tip[0])
            tip[0], tip[1] = len(parents) - 1, tip[1] + 1
        growing = [tip for tip in growing if tip[1] < depth]
    return Tree(bfs_renumber(parents)[0], {"kind": "hybrid budget", "nodes": nodes, "leaves": leaves,
                                "depth": depth})


def hybrid_drafting(engine, plans, profile, temperatures=(0.0,), ngram_tree: Tree | None = None,
                    acceptance=None) -> tuple[HybridDrafter, Tree]:
    """(drafter, the engine's budget tree) for an Engine with a draft model: the hybrid of its
    draft model, planned per temperature by `plans` (temperature -> (tree, expected tokens)),
    and a fresh n-gram drafter on `profile`'s target costs. The budget bounds the plans of
    `temperatures` (every temperature a request may pick a plan for). acceptance: the n-gram
    side's AcceptanceModel (calibrated priors), else the default priors."""
    if engine.draft_backend is None:
        raise RedwoodError("the hybrid drafter needs a draft model (the engine has none)")
    model = DraftModelDrafter(engine.draft_backend, engine._clock, engine.layouts)
    # the n-gram side as `--drafter ngram` builds it: copies up to COPY_DEPTH tokens deep, t(n)
    # read at the request's context (with 8-token chains it kept ~5 tokens a step on whole-file
    # edits where the n-gram drafter alone kept ~19, and lost 40 % to it)
    ngram = NgramDrafter(target_ms=profile.target_ms,
                         target_ms_by_context=getattr(profile, "target_ms_by_context", None),
                         model=acceptance, max_length=COPY_DEPTH)
    ngram_tree = ngram_tree or ngram_budget_tree(depth=COPY_DEPTH)
    drafter = HybridDrafter(model, ngram, profile, plans, ngram_tree=ngram_tree)
    trees = [plans(t)[0] for t in temperatures]
    return drafter, hybrid_budget_tree(trees, ngram_tree)
