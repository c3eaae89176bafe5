"""Keeping loaded weights resident: copy them out of the safetensors file mapping.

transformers maps float32 safetensors files into memory and hands the mapped pages out as
parameters; see own_memory() for why that is a problem for decoding on a busy machine.
"""
from __future__ import annotations

import ctypes
import itertools
import mmap

import torch


def own_memory(model) -> None:
    """Copy every CPU parameter and buffer into process memory.

    transformers maps float32 safetensors files into memory (copy-on-write mmap) and hands the
    mapped pages out as parameters. Those pages are only read from disk on first use and, being
    clean file pages, the kernel may drop them again whenever memory gets tight (other
    processes, a second model) -- after which forwards re-read weights from disk. Copying makes
    the weights ordinary memory that stays resident. We copy storage by storage and, on Linux,
    release each copied file-mapped range at once (madvise), so peak RSS stays ~1x the model
    instead of ~2x until the whole mapping closes."""
    mapped = _file_mapped_ranges()
    by_storage: dict[int, list[torch.Tensor]] = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        if tensor.device.type == "cpu":
            by_storage.setdefault(tensor.untyped_storage().data_ptr(), []).append(tensor)
    with torch.no_grad():
        for start, group in by_storage.items():
            storage = group[0].untyped_storage()
            for tensor in group:                  # every user of this storage gets its own copy
                tensor.data = tensor.data.clone()
            end = start + storage.nbytes()
            if any(low <= start and end <= high for low, high in mapped):
                _drop_pages(start, end)


def _file_mapped_ranges() -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of *.safetensors files (Linux; else [])."""
    ranges = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) >= 6 and fields[-1].endswith(".safetensors"):
                    low, high = fields[0].split("-")
                    ranges.append((int(low, 16), int(high, 16)))
    except OSError:
        pass
    return ranges


def _drop_pages(start: int, end: int) -> None:
    """madvise(MADV_DONTNEED) the whole pages inside [start, end) of a private file mapping:
    they leave RSS now (if touched again they would be re-read from the file, unchanged)."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        page = mmap.PAGESIZE
        first, last = -(-start // page) * page, end // page * page
        if last > first:
            _libc.madvise(first, last - first, 4)                          # MADV_DONTNEED
    except (OSError, AttributeError):
        pass


_libc = None
