"""llama.cpp's logits output buffer read in place: numpy views (and their rows as arrays or
tensors) of the rows the last decode wrote, for a context.

A plain step reads one row of 151,936 floats; copying it costs ~0.2 ms, and right after a
decode every Python, numpy and torch call runs on cold caches (10-70 us for calls that take
1-5 us in a loop). So the views are built once per (address, rows) and handed out again while
the buffer stays put. The address is fetched every time, because llama.cpp moves the buffer when
it grows it, through a prototype of our own whose result is a plain int: the binding's
LP_c_float result and the cast needed to read it cost ~0.05 ms there.

Every view is valid until the next decode on its context (which overwrites the rows) and
must not outlive the context: `LogitsViews.clear` drops them when it is freed.
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch

_get_logits = None           # logits_address's prototype, made once


def logits_address(ctx) -> int | None:
    """llama_get_logits(ctx) as an int address (None for NULL). The prototype is a new function
    object over the same symbol: the binding's own llama_get_logits stays as it is."""
    global _get_logits
    if _get_logits is None:
        import llama_cpp.llama_cpp as binding

        function = binding._lib["llama_get_logits"]
        function.argtypes, function.restype = [ctypes.c_void_p], ctypes.c_void_p
        _get_logits = function
    return _get_logits(ctx)


class LogitsViews:
    """One context's logits buffer as views [rows, V] float32, cached per (address, rows)."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.clear()

    def clear(self) -> None:
        """Forget every view (the context is freed, or about to be)."""
        self._key = self._view = self._rows = self._tensors = None

    def view(self, ctx, rows: int) -> np.ndarray:
        """The first `rows` rows the last decode wrote, [rows, V], in place."""
        address = logits_address(ctx)
        if self._key != (address, rows):                 # as_array builds a ctypes type
            self._key, self._rows, self._tensors = (address, rows), None, None
            pointer = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            self._view = np.ctypeslib.as_array(pointer, shape=(rows, self.vocab_size))
        return self._view

    def rows(self, ctx, rows: int) -> list[np.ndarray]:
        """view(ctx, rows) as one [V] array per row (the slices cost ~0.05 ms after a decode)."""
        view = self.view(ctx, rows)
        if self._rows is None:
            self._rows = list(view)
        return self._rows

    def row_tensors(self, ctx, rows: int) -> list[torch.Tensor]:
        """view(ctx, rows) as one [1, V] tensor per row (torch.from_numpy and the slices cost
        ~0.1 ms after a decode)."""
        view = self.view(ctx, rows)
        if self._tensors is None:
            logits = torch.from_numpy(view)
            self._tensors = [logits[i:i + 1] for i in range(rows)]
        return self._tensors
