"""Which drafted tokens are kept: the verification rules, as pure tensor functions.

verify_tree is exact: the tokens it returns (accepted path, then bonus) are distributed
exactly as sampling them one by one from the target distributions, whatever the draft.
It relies on the children having been drawn by `redwood.decode.sampling.propose_children`
from draft_probs (the law it assumes is spelled out there).
"""
from __future__ import annotations

import torch

from redwood.decode.sampling import process_logits, sample_token
from redwood.plan.tree import Tree

# A residual max(p - q, 0) whose mass is at most this fraction of p's mass is treated
# as empty and p is kept instead. Mathematically the residual's mass is the total
# variation distance TV(p, q), which is also the probability of the rejection that
# leads to it; so keeping p changes the output law by at most this much per rejection.
# Float32 rounding in p and q alone gives residuals of ~1e-7 (V ~ 1.5e5 entries each
# rounded to ~6e-8 relative), so 1e-6 is just above noise and far below any effect a
# chi-square test or a user could see.
RESIDUAL_EPS = 1e-6


def verify_step(logits: torch.Tensor, tokens: torch.Tensor, tree: Tree, draft_probs, point_mass,
                chooser, sampler, position: int):
    """The rule a step's tree is verified by -> (path, bonus). logits [n, V]: the target's
    after each node; draft_probs, point_mass: the proposal's (verify_tree); sampler: the
    request's TokenSampler; position: the request's index of the first new token.
    Greedy: verify_greedy. Temperature alone and point-mass drafts only (draft_probs None):
    verify_walk drawing each node's token from its position's uniforms, so the text is the
    one plain decoding gives with the same seed. Otherwise verify_tree on the processed law."""
    params = sampler.params
    if params.greedy:
        return verify_greedy(logits.argmax(dim=-1), tokens, tree)
    if sampler.positional and draft_probs is None:
        return verify_walk(tokens, tree,
                           lambda node, depth: sampler.token(logits[node], position + depth))
    probs = process_logits(logits, params.temperature, params.top_k, params.top_p)
    return verify_tree(probs, draft_probs, tokens, tree, chooser.replacement, sampler.generator,
                       point_mass)


def verify_greedy(target_argmax: torch.Tensor, tokens: torch.Tensor, tree: Tree):
    """Greedy walk: from the root, move to the child whose token is the target's argmax.

    target_argmax [n] long: the target's argmax after each node; tokens [n] long: the
    token of each node (tokens[0], the root, is not read). Returns (path, bonus):
    path the accepted node indices starting with 0, bonus = target_argmax[path[-1]].
    """
    best = target_argmax.tolist()
    return verify_walk(tokens, tree, lambda node, depth: best[node])


def verify_walk(tokens: torch.Tensor, tree: Tree, token_after):
    """Walk from the root, moving to the child whose token is token_after(node, depth), the
    token the target gives after `node` (depth: node's depth, 0 for the root). Returns (path,
    bonus) as verify_greedy, bonus = the first such token no child holds.

    Exact for any tree of point-mass drafts when token_after(node, depth) samples the target's
    law at node (fresh randomness per output position): the emitted tokens are then sampled one
    by one from the target, and the drafts only decide how many come from one forward
    (decode/token_sampler.py). Greedy when it is the argmax."""
    toks = tokens.tolist()
    node, path = 0, [0]
    while True:
        token = int(token_after(node, len(path) - 1))
        nxt = next((c for c in tree.children[node] if toks[c] == token), None)
        if nxt is None:
            return path, token
        node = nxt
        path.append(node)


def verify_tree(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, tokens: torch.Tensor,
                tree: Tree, replacement: bool, generator: torch.Generator | None,
                point_mass: torch.Tensor | None = None):
    """Sampling walk (Sequoia without replacement, SpecInfer with) -> (path, bonus).

    target_probs [n, V]: the processed target distribution after each node (row i is
    the law of the token that follows node i). draft_probs [n, V]: the processed draft
    distribution at node i that proposed i's children (rows of leaves are not read).
    tokens [n] long: each node's token (tokens[0] not read).
    At node u, with p the current target law (fresh target_probs[u] on arrival), the
    children are checked in rank order: child x is accepted with probability
    min(1, p(x) / q_k(x)), q_k the law that proposed it; on rejection p becomes the
    residual normalise(max(p - q_k, 0)). If no child is accepted (or u is a leaf),
    the bonus token is drawn from the current p.

    Contract with the drafter (exactness depends on it): the children of node u, in
    rank order, are the first columns of propose_children(draft_probs[u], k, replacement)
    (the very same float32 values: which entries are exactly 0 decides when the draft
    is exhausted; children drawn by the uniform fill need nothing extra, their law is
    derived here). Only rows on the walked path are read. `generator` (or the default
    one when None) must live on the device of the tensors; draws are fresh each call.

    point_mass [n] bool (optional): node i was proposed deterministically (q = δ_token, e.g.
    an n-gram lookup). Such a child is accepted with probability p(x) and on rejection the
    residual is p with x removed (max(p - δ_x, 0), normalised): the same rule with q = δ_x,
    so a node may mix sampled and point-mass children (docs/design.md §4). Sampled children
    keep the law of their own draws; draft_probs may be None when no node sampled.
    """
    toks = tokens.tolist()
    deterministic = point_mass.tolist() if point_mass is not None else None
    # One fresh uniform per child node: each child is decided at most once per call.
    uniforms = torch.rand(len(tree), generator=generator, dtype=torch.float64,
                          device=_device_of(generator)).tolist()
    node = 0
    path = [0]
    while True:
        target = _TargetLaw(target_probs[node])
        accepted = _check_children(target, draft_probs, node, tree.children[node], toks,
                                   uniforms, replacement, deterministic)
        if accepted is None:
            return path, sample_token(target.p, generator)
        node = accepted
        path.append(node)


def _device_of(generator) -> torch.device:
    return generator.device if generator is not None else torch.device("cpu")


def _check_children(target, draft_probs, node, children, toks, uniforms, replacement,
                    deterministic=None):
    """Check `node`'s children in rank order against `target` (updated in place by the
    rejections). Returns the accepted child, or None when all are rejected."""
    draft = None                         # built on the first sampled child: leaves' rows unread
    for child in children:
        x = toks[child]
        if deterministic is not None and deterministic[child]:
            # q = δ_x: accept with probability p(x); else p <- normalise(max(p - δ_x, 0)).
            if uniforms[child] * target.mass < float(target.p[x]):
                return child
            target.remove(x)
            continue
        if draft is None:
            draft = _DraftLaw(draft_probs[node], replacement)
        if draft.is_repeat(x):           # without replacement only when width > V
            continue
        # Accept with probability min(1, p(x) / q_k(x)): u * q_k(x) < p(x), no division.
        if uniforms[child] * draft.prob(x) * target.mass < float(target.p[x]):
            return child
        draft.subtract_from(target)      # p <- normalise(max(p - q_k, 0)), q_k's law
        draft.remove(x)
    return None


class _TargetLaw:
    """The current target law at a node, kept unnormalised: p [V] float32 and its mass."""

    def __init__(self, row):
        self.p = row.float()
        self.mass = float(self.p.sum())

    def remove(self, x: int) -> None:
        """The residual after rejecting a point-mass proposal of x: p without x."""
        if self.p[x] <= 0:
            return
        residual = self.p.clone()
        residual[x] = 0.0
        self.replace(residual)

    def replace(self, residual: torch.Tensor) -> None:
        """Move to `residual` (max(p - mass * q_k, 0)), unless its mass is numerically 0."""
        mass = float(residual.sum())
        if mass > RESIDUAL_EPS * self.mass:
            self.p, self.mass = residual, mass


class _DraftLaw:
    """q_k, the law that proposed the next child of a node. With replacement: q itself.
    Without: q with the tokens proposed so far removed and renormalised, or, once that
    mass is 0 (draft exhausted), uniform over the tokens not yet proposed; the same
    zero test as propose_children (entries > 0), so the two agree on when that is."""

    def __init__(self, q, replacement):
        self.q = q.float()
        self.replacement = replacement
        self.rest = self.q                     # q with proposed tokens zeroed (copy on write)
        self.total = float(self.q.sum())
        self.mass = self.total                 # mass of self.rest
        self.proposed: list[int] = []

    def is_repeat(self, x: int) -> bool:
        return not self.replacement and x in self.proposed

    def prob(self, x: int) -> float:
        if self.mass > 0:
            return float(self.rest[x]) / self.mass
        return 1.0 / (self.q.numel() - len(self.proposed))

    def subtract_from(self, target: _TargetLaw) -> None:
        if self.mass > 0:
            residual = torch.add(target.p, self.rest, alpha=-target.mass / self.mass)
        else:                                  # uniform over the unproposed tokens
            scale = target.mass / (self.q.numel() - len(self.proposed))
            residual = target.p - scale
            index = torch.tensor(self.proposed, dtype=torch.long, device=self.q.device)
            residual[index] = target.p[index]  # proposed tokens had q_k = 0
        target.replace(residual.clamp_(min=0.0))

    def remove(self, x: int) -> None:
        if self.replacement:
            return
        self.proposed.append(x)
        if self.mass <= 0:
            return
        if self.rest is self.q:
            self.rest = self.q.clone()
        removed = float(self.rest[x])
        self.rest[x] = 0.0
        self.mass -= removed
        # Subtraction loses the exact zero (and relative accuracy) once little is left:
        # recount then. A float32 sum of non-negatives is 0 exactly when all are 0.
        if self.mass <= 1e-4 * self.total:
            self.mass = float(self.rest.sum())
