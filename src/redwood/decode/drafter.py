"""The `Drafter` protocol: a source of candidate trees, one class per source.

Per generation: `prefill(prompt)` once, then per step `propose(root, ...)` -> Proposal and
`commit(path, tokens)` with what the target kept. A proposal carries, for every node, how it
was proposed, because exact verification needs the proposal law (docs/design.md §4):
- sampled children: their parent's processed draft distribution, a full row of `draft_probs`;
- deterministic children (point masses, e.g. n-gram lookups): `point_mass[i]` is True and the
  law is δ_token; the verifier accepts with probability p(token).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from redwood.decode.layout import TreeLayout


@dataclass
class Proposal:
    tokens: torch.Tensor                    # [n] long, every drafted node's token (tokens[0] = root)
    draft_probs: torch.Tensor | None        # [n, V] float32 law at nodes with sampled children
    layout: TreeLayout                      # the tree drafted: the requested one or a pruned subtree
    point_mass: torch.Tensor | None = None  # [n] bool: node i was proposed deterministically
    draft_seconds: float = 0.0
    draft_forwards: int = 0
    sources: list[str] | None = None        # [n] who proposed node i ("root", "model", "ngram");
                                            # None = the root, then the drafter's one source
    expected_tokens: float | None = None    # the drafter's E(tokens kept this step), bonus
                                            # included; None = it makes no prediction


@runtime_checkable
class Drafter(Protocol):
    def prefill(self, prompt_ids: torch.Tensor) -> None:
        """prompt_ids: [L] long, every token before the first root (may be empty)."""

    def propose(self, root: int, layout: TreeLayout, choose: "ChildChooser",
                min_confidence: float = 0.0) -> Proposal:
        """Draft at most the tree `layout` below `root` (the newest token)."""

    def commit(self, path: list[int], tokens: torch.Tensor) -> None:
        """The target kept `path` (node indices of the last proposal, path[0] = root)."""

    def skip(self, root: int) -> None:
        """The target decoded `root` in a plain step, with no proposal (see decode/governor.py)."""


class ChildChooser:
    """How children are picked from draft logits: greedy top-k, or sampled from the
    processed draft distribution (with or without replacement)."""

    def __init__(self, greedy: bool, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 replacement: bool = False, generator: torch.Generator | None = None):
        self.greedy, self.temperature, self.top_k, self.top_p = greedy, temperature, top_k, top_p
        self.replacement, self.generator = replacement, generator

    @classmethod
    def for_request(cls, params, method: str, generator) -> "ChildChooser":
        """The chooser for SamplingParams `params` under a method (specinfer and chain draw
        i.i.d.; sequoia without replacement)."""
        return cls(params.greedy, params.temperature, params.top_k, params.top_p,
                   replacement=method in ("specinfer", "chain"), generator=generator)

    def __call__(self, logits: torch.Tensor, k: int, law: torch.Tensor | None = None):
        """logits [m, V] -> (children [m, k] long, draft probs [m, V] float32 or None).
        law: the rows' sampling law if already computed (`law(logits)`), else computed here."""
        from redwood.decode.sampling import greedy_children, propose_children

        if self.greedy:
            return greedy_children(logits, k), None
        probs = law if law is not None else self.law(logits)
        return propose_children(probs, k, self.replacement, self.generator), probs

    def law(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's law per row [m, V] float32: the processed sampling distribution, or
        the raw softmax (temperature 1) when greedy (the probability `confidence` reports)."""
        if self.greedy:
            return torch.softmax(logits.float(), dim=-1)
        from redwood.decode.sampling import process_logits

        return process_logits(logits, self.temperature, self.top_k, self.top_p)

    @staticmethod
    def confidence(logits: torch.Tensor, probs: torch.Tensor | None,
                   children: torch.Tensor) -> torch.Tensor:
        """The draft's probability of each chosen child [m, k]: under the sampling law when
        sampling, under the raw softmax (temperature 1) when greedy."""
        if probs is None:
            probs = torch.softmax(logits.float(), dim=-1)
        return probs.gather(1, children)
