"""The plain step's sampler: one token from a logits row read in place (numpy), no tensors.

A plain llama.cpp step costs ~34 ms on the 2-core CPU, and what redwood does around
`llama_decode` should stay within 1.5 % of that (~0.5 ms). Sampling a 151,936-token row through
torch (process_logits + sample_token) allocated several fresh 0.6-1.2 MB tensors per token and
cost ~0.65 ms; this does the same arithmetic in two preallocated buffers:

    p ∝ exp((x - max x) / T)          (float32, the row's softmax at temperature T)
    block b with probability mass(b) / total   (blocks of BLOCK tokens, float64 sums)
    token i in b with probability p_i / mass(b)

the two-level inverse CDF of decode/sampling.py's sample_token (float64 sums, never a token of
zero mass; a whole-row cumsum in numpy alone cost 0.54 ms), with its uniforms drawn from the
request's torch generator, so a seeded request repeats. Only for
top-k off and top-p 1 (the default); other settings keep the torch path. The law is the
target's processed distribution either way (tested by chi-square on the llama.cpp backend).
"""
from __future__ import annotations

import numpy as np
import torch


BLOCK = 512


class PlainSampler:
    """Reusable buffers for rows of one vocabulary size."""

    def __init__(self):
        self._scaled = np.empty(0, dtype=np.float32)

    @staticmethod
    def handles(params) -> bool:
        """Whether these SamplingParams take this path (temperature only)."""
        return not params.greedy and params.top_k == 0 and params.top_p >= 1.0

    def sample(self, row: np.ndarray, temperature: float, generator: torch.Generator) -> int:
        """One token from softmax(row / temperature); row: [V] float32 (may be a view that the
        next decode overwrites: it is read once, here)."""
        vocab = row.shape[0]
        blocks = -(-vocab // BLOCK)
        if self._scaled.shape[0] != blocks * BLOCK:
            self._scaled = np.zeros(blocks * BLOCK, dtype=np.float32)    # the tail stays 0
        scaled = self._scaled[:vocab]
        np.subtract(row, row.max(), out=scaled)
        scaled *= np.float32(1.0 / temperature)
        np.exp(scaled, out=scaled)
        grid = self._scaled.reshape(blocks, BLOCK)
        block = _inverse_cdf(np.cumsum(grid.sum(axis=1, dtype=np.float64)), generator)
        inside = _inverse_cdf(np.cumsum(grid[block], dtype=np.float64), generator)
        return block * BLOCK + inside


def _inverse_cdf(cdf: np.ndarray, generator) -> int:
    """Index i with probability (cdf[i] - cdf[i-1]) / cdf[-1], never one of zero mass."""
    u = float(torch.rand((), dtype=torch.float64, generator=generator))
    index = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    if index >= len(cdf):                          # u * total rounded up to the total
        index = int(np.searchsorted(cdf, cdf[-1], side="left"))
    return index
