"""Logits -> distributions, and drawing a node's children from the draft distribution.

Pure torch functions, no state. Every random draw comes from the caller's
`torch.Generator`, so the same seed gives the same tokens.

The children drawn here are checked by `redwood.verify.verify_tree`, which assumes
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

    A full sort of a 151,936-token row is ~50x slower than a top-k of a few hundred,
    and the nucleus is almost always small, so look at the most probable `width`
    tokens first and sort everything only when they do not reach top_p.
    probs: [..., V] float32 summing to 1 along the last axis.
    """
    vocab = probs.shape[-1]
    width = min(vocab, max(256, top_k if top_k > 0 else 0))
    while True:
        head = torch.topk(probs, width, dim=-1).values              # [..., width], descending
        mass_before = torch.cumsum(head, dim=-1) - head              # mass strictly above each
        covered = mass_before[..., -1] + head[..., -1] >= top_p
        if width == vocab or bool(covered.all()):
            break
        width = vocab
    keep_count = (mass_before < top_p).sum(dim=-1, keepdim=True)    # [..., 1], >= 1 always
    threshold = torch.gather(head, -1, keep_count - 1)               # least probable kept
    kept = torch.where(probs >= threshold, probs, torch.zeros_like(probs))
    return kept / kept.sum(dim=-1, keepdim=True)


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
    proposed. If k > V, children beyond the V-th repeat token ids (never reached by
    an exact verifier: after V rejections nothing is left to reject).
    Any prefix of the k columns has the same law as drawing that many children, so
    rows that need fewer children may use the first few columns.
    """
    q = q.float()
    if replacement:
        return torch.multinomial(q, k, replacement=True, generator=generator)
    return _without_replacement(q, k, generator)


def _without_replacement(q: torch.Tensor, k: int, generator) -> torch.Tensor:
    """Exponential race: token i arrives at E_i / q_i, E_i ~ Exp(1) i.i.d.; the order of
    arrival is the order of sequential sampling without replacement. Compared in log
    space (log q_i - log E_i, larger first) so that tiny q_i never underflow to a tie.
    """
    m, vocab = q.shape
    take = min(k, vocab)
    race = torch.empty_like(q).exponential_(generator=generator)   # [m, V]
    scores = torch.log(q) - torch.log(race)                        # -inf where q == 0
    tokens = torch.topk(scores, take, dim=-1).indices               # [m, take]
    support = (q > 0).sum(dim=-1)                                  # [m]
    short_rows = torch.nonzero(support < take).flatten().tolist()
    for row in short_rows:
        _uniform_fill(tokens[row], int(support[row]), vocab, generator)
    if k > vocab:
        tokens = torch.cat([tokens, tokens[:, :k - vocab]], dim=-1)
    return tokens


def _uniform_fill(row_tokens: torch.Tensor, support: int, vocab: int, generator) -> None:
    """Overwrite row_tokens[support:] with tokens drawn uniformly without replacement
    from those not in row_tokens[:support] (the draft's support, already proposed).
    Uniform keys + top-k over the remaining tokens; in place.
    """
    keys = torch.rand(vocab, generator=generator, device=row_tokens.device)
    keys[row_tokens[:support]] = -1.0                              # never drawn again
    fill = torch.topk(keys, row_tokens.numel() - support).indices
    row_tokens[support:] = fill
