"""The plain step's sampler: one token from a logits row read in place (numpy or one C call), no
tensors.

A plain llama.cpp step costs ~34 ms on the 2-core CPU, and what redwood does around
`llama_decode` should stay within 1.5 % of that (~0.5 ms). Sampling a 151,936-token row through
torch (process_logits + sample_token) allocated several fresh 0.6-1.2 MB tensors per token and
cost ~0.65 ms; exponentiating the whole row in numpy still cost ~0.35 ms. Almost all of that
row weighs nothing: at temperature T a token whose logit sits more than TAIL_GAP·T below the
maximum weighs under e^-TAIL_GAP of the top token. So this samples by rejection from an
envelope that is exact on the head and flat on the tail:

    top = max x;  head = {i : x_i >= top - G·T};  w_i = exp((x_i - top) / T)   (summed in float64)
    envelope: w_i on the head, b = e^-G on each of the n_tail other tokens (b >= their w)
    draw from the envelope: a head token (prob ∝ w_i, always kept), or a uniform tail token j,
    kept with probability w_j / b; a rejected draw starts over

which is exactly softmax(x / T) (rejection sampling: envelope >= target everywhere, acceptance
target / envelope). Two passes over the row (max, compare) instead of five; the tail is
touched only when it is drawn, with probability <= n_tail·b / (sum of head w) <= 152k·e^-16
≈ 1.7 % (G = 16 ≈ ln V + 4). On real rows at T = 0.6 the head is 30-450 tokens, at T = 1
2-12 thousand: 0.07 / 0.15-0.18 ms a token against 0.21-0.23 ms for the whole-row inverse CDF.
Cold right after a decode, each of the eight numpy calls that takes cost 10-60 us (~0.2 ms a
token in all); where a C compiler is found the whole draw is one native call instead
(plain_sampling.c, built on first use by decode/native_sampling.py: ~0.09 ms), with the same
head, the same uniforms in the same order and the same rule (its head weights are summed in
double precision, as the numpy path does for heads up to SMALL_HEAD tokens).
Uniforms come from the caller: the request's position stream (decode/token_sampler.py: keyed
by seed and position, so a seeded request repeats drafted or not).
Only for top-k off and top-p 1 (the default); other settings keep the torch path.
"""
from __future__ import annotations

import bisect
import math
from typing import Callable

import numpy as np

from redwood.errors import RedwoodError

TAIL_GAP = 16.0       # G: tail tokens weigh < e^-16 ≈ 1.1e-7 of the top token each, so over
                      # 152k of them the envelope's tail is drawn at most ~1.7 % of the time


class PlainSampler:
    """Samples rows of logits at a temperature; tail_gap: G above (tests use small gaps so the
    envelope's tail is drawn often); native=False keeps the numpy path even where the C call
    builds (decode/native_sampling.py)."""

    def __init__(self, tail_gap: float = TAIL_GAP, native: bool = True):
        if not tail_gap > 0:
            raise ValueError(f"tail_gap must be > 0, got {tail_gap}")
        self.tail_gap = float(tail_gap)
        self._mask: np.ndarray | None = None      # [V] bool, the head's mask (reused)
        self.native = bool(native)                # the C call where it builds (module doc)
        self._native = None                       # its NativeHead once looked up, False: none

    @staticmethod
    def handles(params) -> bool:
        """Whether these SamplingParams take this path (temperature only)."""
        return not params.greedy and params.top_k == 0 and params.top_p >= 1.0

    def sample(self, row: np.ndarray, temperature: float, uniform: Callable[[], float]) -> int:
        """One token from softmax(row / temperature); row: [V] float32 (may be a view that the
        next decode overwrites: it is read once, here). uniform: gives the next uniform in
        [0, 1) (the rejection loop may take more than one). The native call and the numpy
        path draw the same uniforms in the same order."""
        native = self._native_for(row)
        if native is not None:
            token = native.sample(row, temperature, self.tail_gap, uniform())
            if token >= 0:
                return int(token)
            if token == -2:
                raise _not_finite(row)
            top, floor, _, size = native.out.tolist()
            head, cdf = native.ids[:int(size)], native.cdf[:int(size)]
            return self._draw(row, temperature, top, floor, head, cdf, uniform, in_tail=True)
        top = float(row.max())
        if not math.isfinite(top):
            raise _not_finite(row)
        floor = top - self.tail_gap * temperature
        if self._mask is None or self._mask.shape != row.shape:
            self._mask = np.empty(row.shape, dtype=bool)          # reused: 152 KB a token
        head = np.flatnonzero(np.greater_equal(row, floor, out=self._mask))   # [h] the mass
        cdf = _head_cdf(row[head], top, temperature)              # [h] float64, rising
        return self._draw(row, temperature, top, floor, head, cdf, uniform)

    def _draw(self, row, temperature: float, top: float, floor: float, head, cdf, uniform,
              in_tail: bool = False) -> int:
        """Draw from the envelope over head [h] (cumulative weights cdf [h]) and the tail;
        in_tail: the first draw already fell in the tail (the native call made it)."""
        bound = math.exp(-self.tail_gap)                          # b >= any tail token's w
        mass, tail_mass = float(cdf[-1]), (row.shape[0] - len(head)) * bound
        tail = None
        while True:
            if not in_tail:
                u = uniform() * (mass + tail_mass)
                if u < mass:
                    return int(head[min(bisect.bisect_right(cdf, u), len(cdf) - 1)])
            in_tail = False
            if tail is None:                                      # rare: build it on demand
                tail = np.flatnonzero(row < floor)
            j = int(tail[min(int(uniform() * len(tail)), len(tail) - 1)])
            if uniform() * bound < math.exp((float(row[j]) - top) / temperature):
                return j

    def _native_for(self, row: np.ndarray):
        """The native call for this row, or None (off, unavailable, or a row it does not
        take: not float32 or not contiguous)."""
        if self._native is None:                  # looked up once: a NativeHead, or False
            from redwood.decode.native_sampling import native_head

            self._native = (native_head() if self.native else None) or False
        if self._native and row.dtype == np.float32 and row.flags.c_contiguous:
            return self._native
        return None


def _not_finite(row: np.ndarray) -> RedwoodError:
    return RedwoodError(f"the target's logits are not finite (max {float(np.max(row))}): the "
                        "model or its file is broken")


SMALL_HEAD = 64       # heads up to this many tokens are weighed in Python: each numpy call on
                      # a tiny array costs 10-20 us right after a decode (cold), a float op 0.1


def _head_cdf(logits: np.ndarray, top: float, temperature: float):
    """Cumulative weights exp((x - top) / T) of the head's logits [h], in float64: a list for a
    small head (bisect searches it), else an array (bisect works on both)."""
    if len(logits) <= SMALL_HEAD:
        scale, total, cdf = 1.0 / temperature, 0.0, []
        for x in logits.tolist():
            total += math.exp((x - top) * scale)
            cdf.append(total)
        return cdf
    weights = logits - np.float32(top)                            # a copy: the row stays
    weights *= np.float32(1.0 / temperature)
    return np.cumsum(np.exp(weights, out=weights), dtype=np.float64)

