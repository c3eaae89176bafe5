"""Logits -> distributions, and drawing a node's children from the draft distribution.

Pure torch functions, no state. Every random draw comes from the caller's
`torch.Generator`, so the same seed gives the same tokens.

The children drawn here are checked by `redwood.decode.verify.verify_tree`, which assumes
they were drawn *exactly* by the law described in `propose_children`; the two files
must change together.
"""
from __future__ import annotations

import torch

from redwood.errors import RedwoodError


def process_logits(logits: torch.Tensor, temperature: float, top_k: int = 0,
                   top_p: float = 1.0) -> torch.Tensor:
    """Logits [..., V] -> float32 probabilities [..., V] (temperature, then top-k, then top-p).

    temperature > 0 (greedy decoding never calls this). top_k = 0 (or >= V) is off;
    top_p = 1.0 is off. Ties are kept whole, so the result never depends on how
    torch orders equal values: top-k keeps every token whose logit equals the k-th
    largest; top-p keeps every token whose probability is at least that of the
    least probable token of the smallest most-probable set with mass >= top_p.
    At least one token always survives. Kept tokens are renormalised to sum to 1;
    dropped tokens are exactly 0.
    """
    _check_params(temperature, top_k, top_p)
    scores = logits.float() / float(temperature)       # [..., V] float32 whatever the input
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]      # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        probs = _top_p_filter(probs, float(top_p), top_k)
    return probs


def _check_params(temperature, top_k, top_p) -> None:
    if not temperature > 0:                              # also catches NaN
        raise RedwoodError(f"temperature must be > 0 for sampling (got {temperature}); "
                           "use temperature 0 for greedy decoding")
    if top_k < 0:
        raise RedwoodError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise RedwoodError(f"top_p must be in (0, 1] (1 = off), got {top_p}")


def _top_p_filter(probs: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """Zero all but the smallest most-probable set with mass >= top_p, renormalise.

    A full sort of a 151,936-token row costs ~50x a top-k of a few hundred, and the
    nucleus is usually small: read the cut from the most probable `width` tokens, and
    only for rows they do not cover find it by bisection (_nucleus_threshold).
    probs: [..., V] float32 summing to 1 along the last axis.
    """
    vocab = probs.shape[-1]
    flat = probs.reshape(-1, vocab)                                 # [r, V]
    width = min(vocab, max(256, top_k))
    head = torch.topk(flat, width, dim=-1).values.double()          # [r, w], descending
    mass_before = torch.cumsum(head, dim=-1) - head                  # mass strictly above each
    keep_count = (mass_before < top_p).sum(dim=-1, keepdim=True)    # [r, 1], >= 1 always
    threshold = torch.gather(head, -1, keep_count - 1).float()       # least probable kept
    uncovered = torch.nonzero(mass_before[:, -1] + head[:, -1] < top_p).flatten()
    if uncovered.numel() and width < vocab:
        threshold[uncovered] = _nucleus_threshold(flat[uncovered], top_p)
    kept = torch.where(flat >= threshold, flat, torch.zeros_like(flat))
    return (kept / kept.sum(dim=-1, keepdim=True)).reshape(probs.shape)


def _nucleus_threshold(rows: torch.Tensor, top_p: float) -> torch.Tensor:
    """rows [r, V] float32 >= 0 -> [r, 1] float32: per row the largest entry value t with
    mass(entries >= t) >= top_p (0 if even the whole row falls short).

    No sort: the bit patterns of non-negative floats order them like their values, so
    a mass histogram over the high 16 bits finds the bucket holding t, and a histogram
    over the low 15 bits of that bucket's few entries finds t itself, exactly.
    Bucket masses are float32 sums (relative error ~1e-7, the precision of the probs).
    """
    r = rows.shape[0]
    bits = rows.view(torch.int32)                                  # [r, V], >= 0
    high = (bits >> 15).long()                                     # [r, V] in [0, 2^16)
    coarse = torch.zeros(r, 1 << 16, dtype=rows.dtype, device=rows.device)
    coarse = coarse.scatter_add_(1, high, rows).double()
    at_or_above = _mass_at_or_above(coarse)                        # [r, 2^16]
    bucket = (at_or_above >= top_p).sum(dim=-1, keepdim=True) - 1  # [r, 1]; -1: keep all
    safe = bucket.clamp(min=0)
    above = at_or_above.gather(1, safe) - coarse.gather(1, safe)   # mass of buckets > bucket
    row, col = torch.nonzero(high == bucket, as_tuple=True)        # the bucket's entries
    fine = torch.zeros(r, 1 << 15, dtype=torch.float64, device=rows.device)
    fine.index_put_((row, (bits[row, col] & 0x7FFF).long()), rows[row, col].double(),
                    accumulate=True)
    fine_at_or_above = _mass_at_or_above(fine) + above
    low = ((fine_at_or_above >= top_p).sum(dim=-1, keepdim=True) - 1).clamp(min=0)
    threshold = torch.where(bucket >= 0, (bucket << 15) | low, 0)
    return threshold.int().view(torch.float32)


def _mass_at_or_above(hist: torch.Tensor) -> torch.Tensor:
    """hist [r, b] float64 -> [r, b]: mass in bins >= each bin (non-increasing)."""
    below = torch.cumsum(hist, dim=-1)
    below = torch.cat([torch.zeros_like(below[:, :1]), below[:, :-1]], dim=-1)
    return below[:, -1:] + hist[:, -1:] - below


def greedy_children(draft_logits: torch.Tensor, k: int) -> torch.Tensor:
    """Draft logits [m, V] -> the k most likely tokens per row [m, k] long, in rank order.

    If k > V the row is padded by repeating its last token (a duplicate can never be
    the first child that matches the target's argmax, so it changes nothing).
    """
    vocab = draft_logits.shape[-1]
    tokens = torch.topk(draft_logits, min(k, vocab), dim=-1).indices
    if k > vocab:
        tokens = torch.cat([tokens, tokens[:, -1:].expand(-1, k - vocab)], dim=-1)
    return tokens


def propose_children(q: torch.Tensor, k: int, replacement: bool,
                     generator: torch.Generator | None) -> torch.Tensor:
    """Draw k children per row of q [m, V] (non-negative, need not sum to 1) -> [m, k] long.

    replacement=True: k i.i.d. draws from q (SpecInfer).
    replacement=False: exactly the law of sequential sampling without replacement
    from q (Sequoia): child j is drawn from q with children 1..j-1 removed and
    renormalised. Once q's support is used up ("draft exhausted", more children
    than tokens with q > 0), each further child is uniform over the tokens not yet
    proposed. If k > V, children beyond the V-th repeat the row's first tokens
    (an exact verifier never reaches them: after V rejections nothing is left).
    Any prefix of the k columns has the same law as drawing that many children, so
    rows that need fewer children may use the first few columns.
    A 1-D q [V] gives tokens [k].
    """
    if q.dim() == 1:
        return propose_children(q.unsqueeze(0), k, replacement, generator)[0]
    return _draw_children(q.float(), k, replacement, generator)


def sample_token(p: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from p [V] (non-negative, need not sum to 1), by float64 inverse CDF:
    exact to the precision of p. (torch.multinomial rounds its cumulative sums to
    float32, which misplaces the mass of tokens below ~6e-8 on a large vocabulary.)
    A block of TAIL_BLOCK tokens is picked by its mass, then a token inside it."""
    vocab = p.numel()
    if vocab <= TAIL_BLOCK:
        return int(_inverse_cdf(p.double().cumsum(dim=0).unsqueeze(0), generator)[0])
    blocks = -(-vocab // TAIL_BLOCK)
    padded = torch.zeros(blocks * TAIL_BLOCK, dtype=torch.float32, device=p.device)
    padded[:vocab] = p
    padded = padded.view(blocks, TAIL_BLOCK)
    block_mass = padded.sum(dim=-1).double()                  # float32 sums, as _Tail
    block = int(_inverse_cdf(block_mass.cumsum(dim=0).unsqueeze(0), generator)[0])
    inside = padded[block].double().cumsum(dim=0).unsqueeze(0)
    return block * TAIL_BLOCK + int(_inverse_cdf(inside, generator)[0])


# Children are drawn by float64 inverse CDF over the HEAD_WIDTH most probable tokens,
# plus the rest of the vocabulary (the "tail", see _Tail) as one more outcome, opened
# only when a draw lands in it. An exponential race or torch.multinomial draws float32
# randomness for every token of every row (~8 ms per 151,936-token row on one core);
# this costs one top-k and one pass of block sums per row, then O(V / B + B) per draw.
HEAD_WIDTH = 64
TAIL_BLOCK = 512


def _draw_children(q: torch.Tensor, k: int, replacement: bool, generator) -> torch.Tensor:
    m, vocab = q.shape
    width = min(vocab, HEAD_WIDTH)
    head_q, head_tokens = torch.topk(q, width, dim=-1)              # [m, w], descending
    head = head_q.double()                 # drawable head mass; taken entries set to 0
    tail = _Tail(q, head_tokens, generator) if width < vocab else None
    tokens = torch.empty(m, k, dtype=torch.long, device=q.device)
    for j in range(k):
        cum = head.cumsum(dim=-1)                                  # [m, w] float64
        head_mass = cum[:, -1]
        tail_mass = tail.mass if tail is not None else torch.zeros_like(head_mass)
        u = torch.rand(m, dtype=torch.float64, device=q.device, generator=generator)
        point = u * (head_mass + tail_mass)                        # [m]
        # u * mass can round up to mass itself; with an empty tail that is still the head.
        in_head = (point < head_mass) | ((tail_mass == 0) & (head_mass > 0))
        pos = torch.searchsorted(cum, point.unsqueeze(-1), right=True)   # [m, 1]
        last_positive = (cum >= head_mass.unsqueeze(-1)).int().argmax(dim=-1, keepdim=True)
        pos = torch.minimum(pos, last_positive)
        tokens[:, j] = head_tokens.gather(1, pos).squeeze(1)
        if not replacement:
            taken = torch.where(in_head.unsqueeze(-1), 0.0, head.gather(1, pos))
            head.scatter_(1, pos, taken)
        outside = ~in_head
        if bool(outside.any()):
            _draw_outside_head(j, tokens, outside, tail_mass > 0, tail, vocab, replacement,
                               generator)
    return tokens


def _draw_outside_head(j, tokens, outside, tail_left, tail, vocab, replacement, generator):
    """Child j of the rows `outside` [m] bool where the head draw did not apply: from the
    tail where it has mass left (tail_left [m] bool), else (draft exhausted) uniform over
    the tokens not yet proposed. Writes tokens[:, j] in place."""
    from_tail = torch.nonzero(outside & tail_left).flatten()
    if from_tail.numel():
        tokens[from_tail, j] = tail.draw(from_tail, remove=not replacement)
    empty = torch.nonzero(outside & ~tail_left).flatten()
    if empty.numel():
        if replacement:
            raise ValueError("propose_children: a row of q has no positive mass")
        tokens[empty, j] = _uniform_unproposed(tokens[empty, :j], vocab, generator)


def _uniform_unproposed(proposed: torch.Tensor, vocab: int, generator) -> torch.Tensor:
    """proposed [r, j] long -> [r]: per row, a token uniform over those not in the row
    (rejection sampling: exact, and ~1 round when j << V). With j >= V nothing is left
    and the row repeats its (j - V)-th token."""
    rows, j = proposed.shape
    if j >= vocab:
        return proposed[:, j - vocab]
    out = torch.empty(rows, dtype=torch.long, device=proposed.device)
    todo = torch.arange(rows, device=proposed.device)
    while todo.numel():
        x = torch.randint(vocab, (todo.numel(),), generator=generator, device=proposed.device)
        fresh = ~(x.unsqueeze(-1) == proposed[todo]).any(dim=-1)
        out[todo[fresh]] = x[fresh]
        todo = todo[~fresh]
    return out


class _Tail:
    """The tokens outside each row's head, split into blocks of TAIL_BLOCK tokens; a draw
    picks a block by its mass, then a token inside it, both by float64 inverse CDF, so a
    draw costs O(V / B + B) instead of O(V). Removing a token recomputes its block's
    mass, which is exactly 0 once the block is empty (and the row's mass with it)."""

    def __init__(self, q, head_tokens, generator):
        m, vocab = q.shape
        self.blocks = -(-vocab // TAIL_BLOCK)
        rows = torch.zeros(m, self.blocks * TAIL_BLOCK, dtype=q.dtype, device=q.device)
        rows[:, :vocab] = q
        rows.scatter_(1, head_tokens, 0.0)
        self.rows = rows.view(m, self.blocks, TAIL_BLOCK)          # [m, nb, B] float32
        # float32 block sums: relative error ~1e-7, the precision of q itself.
        self.block_mass = self.rows.sum(dim=-1).double()           # [m, nb]
        self.mass = self.block_mass.sum(dim=-1)                    # [m]
        self.generator = generator

    def draw(self, rows: torch.Tensor, remove: bool) -> torch.Tensor:
        """One token for each row in rows [r] long (all with tail mass > 0) -> [r] long."""
        block_cum = self.block_mass[rows].cumsum(dim=-1)           # [r, nb]
        block = _inverse_cdf(block_cum, self.generator)            # [r]
        inside = self.rows[rows, block].double()                  # [r, B]
        offset = _inverse_cdf(inside.cumsum(dim=-1), self.generator)
        if remove:
            self.rows[rows, block, offset] = 0.0
            self.block_mass[rows, block] = self.rows[rows, block].double().sum(dim=-1)
            self.mass[rows] = self.block_mass[rows].sum(dim=-1)
        return block * TAIL_BLOCK + offset


def _inverse_cdf(cum: torch.Tensor, generator) -> torch.Tensor:
    """cum [r, w] float64 cumulative masses (last column > 0) -> [r] index i with
    probability (cum[i] - cum[i-1]) / cum[-1]. Never an index of zero mass: u * total
    can round up to total, so the result is capped at the last index of positive mass."""
    total = cum[:, -1:]
    u = torch.rand(total.shape, dtype=torch.float64, device=cum.device, generator=generator)
    index = torch.searchsorted(cum, u * total, right=True)
    last_positive = (cum >= total).int().argmax(dim=-1, keepdim=True)
    return torch.minimum(index, last_positive).squeeze(-1)
