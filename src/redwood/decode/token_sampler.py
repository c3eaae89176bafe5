"""The token at output position i, the same whichever step decides it.

A plain step samples position i from the target's row. A speculative step whose drafts are all
point masses (prompt lookup, the memory) walks its tree instead: at each node on the path it
draws the token the target samples at that node's position and follows the child holding it
(verify.verify_walk); the first draw no child holds is the bonus. Both draw position i from
uniforms keyed by (seed, i) alone, so with temperature-only sampling (the default; top-k / top-p
keep the request's torch generator and verify_tree):
- exact: each position's token is a sample of the target's law there, from uniforms no other
  position reads (for a point-mass child the rule "accept x with probability p(x), else sample
  the rest" is the same law as "sample y from p, keep x if y = x");
- a seeded request gives the same text drafted or not, as llama.cpp's speculative decoding does
  (up to the kernels' batch-shape differences in the logits, docs/design.md §5.4), and a request
  sent again with its seed replays its text, which the memory of earlier answers then drafts.
Uniforms: splitmix64 over a (seed, position, draw) counter, 53 bits each.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from redwood.decode.plain_sampling import PlainSampler

_MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """One step of splitmix64 (Steele, Lea, Flood 2014): a 64-bit mix whose outputs over a
    counter pass BigCrush; here the counter is (seed, position, draw)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class PositionUniforms:
    """Uniforms in [0, 1) for each output position, from a seed."""

    def __init__(self, seed: int):
        self.seed = splitmix64(int(seed) & _MASK)

    def stream(self, position: int) -> Callable[[], float]:
        """The uniforms of `position`, one per call (the plain sampler's rejection loop may
        take more than one)."""
        key = splitmix64(self.seed ^ (int(position) * 0xD1B54A32D192ED03 & _MASK))
        draws = [0]

        def uniform() -> float:
            draws[0] += 1
            return (splitmix64((key + draws[0]) & _MASK) >> 11) * (1.0 / (1 << 53))
        return uniform


class TokenSampler:
    """A request's sampler: the token at a position from the target's logits row there (numpy
    [V] or a torch row). Greedy: the first maximum. Temperature alone: PlainSampler over the
    position's uniforms (`positional`). Otherwise process_logits + sample_token on the request's
    generator, in call order."""

    def __init__(self, params, generator: torch.Generator, plain: PlainSampler | None = None):
        self.params, self.generator = params, generator
        self.plain = plain if plain is not None else PlainSampler()
        self.uniforms = (PositionUniforms(generator.initial_seed())
                         if PlainSampler.handles(params) else None)

    @property
    def positional(self) -> bool:
        """Whether a position's token depends on the seed and the position alone, so a tree of
        point-mass drafts is verified by verify_walk."""
        return self.uniforms is not None

    def token(self, row, position: int) -> int:
        if self.params.greedy:
            return int(np.argmax(row)) if isinstance(row, np.ndarray) else int(row.argmax())
        if self.uniforms is not None:
            if not isinstance(row, np.ndarray):
                row = row.detach().to("cpu", torch.float32).numpy()
            return self.plain.sample(row, self.params.temperature, self.uniforms.stream(position))
        from redwood.decode.sampling import process_logits, sample_token

        if isinstance(row, np.ndarray):
            row = torch.from_numpy(row)
        probs = process_logits(row, self.params.temperature, self.params.top_k, self.params.top_p)
        return int(sample_token(probs, self.generator))
