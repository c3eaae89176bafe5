"""Which drafted tokens are kept: the verification rules, as pure tensor functions.

verify_tree is exact: the tokens it returns (accepted path, then bonus) are distributed
exactly as sampling them one by one from the target distributions, whatever the draft.
It relies on the children having been drawn by `redwood.sampling.propose_children`
from draft_probs (the law it assumes is spelled out there).
"""
from __future__ import annotations

import torch

from redwood.tree import Tree

# A residual max(p - q, 0) whose mass is at most this fraction of p's mass is treated
# as empty and p is kept instead. Mathematically the residual's mass is the total
# variation distance TV(p, q), which is also the probability of the rejection that
# leads to it; so keeping p changes the output law by at most this much per rejection.
# Float32 rounding in p and q alone gives residuals of ~1e-7 (V ~ 1.5e5 entries each
# rounded to ~6e-8 relative), so 1e-6 is just above noise and far below any effect a
# chi-square test or a user could see.
RESIDUAL_EPS = 1e-6


def verify_greedy(target_argmax: torch.Tensor, tokens: torch.Tensor, tree: Tree):
    """Greedy walk: from the root, move to the child whose token is the target's argmax.

    target_argmax [n] long: the target's argmax after each node; tokens [n] long: the
    token of each node (tokens[0], the root, is not read). Returns (path, bonus):
    path the accepted node indices starting with 0, bonus = target_argmax[path[-1]].
    """
    best = target_argmax.tolist()
    toks = tokens.tolist()
    node = 0
    path = [0]
    while True:
        nxt = next((c for c in tree.children[node] if toks[c] == best[node]), None)
        if nxt is None:
            return path, int(best[node])
        node = nxt
        path.append(node)


def verify_tree(target_probs: torch.Tensor, draft_probs: torch.Tensor, tokens: torch.Tensor,
                tree: Tree, replacement: bool, generator: torch.Generator | None):
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
    """
    toks = tokens.tolist()
    # One fresh uniform per child node: each child is decided at most once per call.
    uniforms = torch.rand(len(tree), generator=generator, dtype=torch.float64,
                          device=_device_of(generator)).tolist()
    node = 0
    path = [0]
    while True:
        p = target_probs[node].float()
        accepted, p = _check_children(p, draft_probs[node], tree.children[node], toks,
                                      uniforms, replacement)
        if accepted is None:
            bonus = torch.multinomial(p.to(_device_of(generator)), 1, generator=generator)
            return path, int(bonus)
        node = accepted
        path.append(node)


def _device_of(generator) -> torch.device:
    return generator.device if generator is not None else torch.device("cpu")


def _check_children(p, q, children, toks, uniforms, replacement):
    """Check one node's children in rank order. p, q: [V]. Returns (accepted child or
    None, current target law p after the rejections)."""
    if not children:
        return None, p
    q = q.float()
    vocab = q.shape[0]
    proposed = torch.zeros(vocab, dtype=torch.bool, device=q.device)   # tokens seen so far
    law = q / q.sum()                            # with replacement: every child's q_k
    for child in children:
        x = toks[child]
        if not replacement:
            if bool(proposed[x]):                # a repeat (only when width > V): skip it
                continue
            law = _remaining_law(q, proposed)
            proposed[x] = True
        if uniforms[child] * float(law[x]) < float(p[x]):   # u < p/q_k, no division
            return child, p
        p = _residual(p, law)
    return None, p


def _remaining_law(q, proposed):
    """The law of the next child without replacement: q with proposed tokens removed and
    renormalised, or, once that mass is 0 (draft exhausted), uniform over the tokens not
    yet proposed. Same zero test as propose_children (q > 0), so the two agree."""
    rest = q.masked_fill(proposed, 0.0)
    mass = rest.sum()
    if float(mass) > 0:
        return rest / mass
    free = (~proposed).float()
    return free / free.sum().clamp_min(1.0)


def _residual(p, law):
    """normalise(max(p - law, 0)), or p itself when that residual is (numerically) empty."""
    res = torch.clamp(p - law, min=0.0)
    mass = float(res.sum())
    if mass <= RESIDUAL_EPS * float(p.sum()):
        return p
    return res / mass
