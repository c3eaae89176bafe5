"""The plain sampler's one native call (plain_sampling.c), compiled on first use.

Each numpy call over a 151,936-float logits row right after a decode cost 10-60 us on a 2-core
CPU, and the sampler needed eight of them (~0.2 ms a token, 0.6 % of a 35 ms step, a third of
all redwood did around `llama_decode` at T 0.6). One C call does the same work in ~0.09 ms,
most of it reading the row the decode just wrote.

The C file ships with the package; the first process that needs it compiles it with the
system's C compiler (`$CC`, else `cc`; portable flags, no -march) into
`$REDWOOD_CACHE/native/` under a name that digests the source, the compiler and the platform,
so an edited source or another machine type builds its own copy. Compiling takes ~0.3 s, once
per machine, under a file lock. Without a compiler, or with `REDWOOD_NATIVE=0`, the sampler
keeps its numpy path (the same law; decode/plain_sampling.py).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

log = logging.getLogger("redwood.decode")

SOURCE = Path(__file__).with_name("plain_sampling.c")
FLAGS = ["-O2", "-shared", "-fPIC"]


class NativeHead:
    """`redwood_sample_head` (plain_sampling.c's comment says what it computes) with the
    buffers it writes: ids [V] int32, cdf [V] float64, out [4] float64, sized per row length."""

    def __init__(self, function):
        self._function = function
        self.ids = self.cdf = self.out = None
        self._pointers: tuple[int, int, int] | None = None

    def sample(self, row, temperature: float, gap: float, u01: float) -> int:
        """The head token, -1 (the draw fell in the tail) or -2 (the row is not finite);
        row: [V] float32, C-contiguous."""
        if self.ids is None or self.ids.shape[0] < row.shape[0]:
            self.ids = np.empty(row.shape[0], dtype=np.int32)
            self.cdf = np.empty(row.shape[0], dtype=np.float64)
            self.out = np.empty(4, dtype=np.float64)
            self._pointers = (self.ids.ctypes.data, self.cdf.ctypes.data, self.out.ctypes.data)
        ids, cdf, out = self._pointers
        return self._function(row.ctypes.data, row.shape[0], temperature, gap, u01, ids, cdf,
                              out)


def native_head() -> NativeHead | None:
    """A NativeHead for this thread's use (its buffers are its own), or None where the native
    helper is off or cannot be built."""
    function = _library_function()
    return NativeHead(function) if function is not None else None


def prepare() -> bool:
    """Build (once per machine) and load the native call now, so that no request pays for it;
    whether it is available."""
    return _library_function() is not None


@lru_cache(maxsize=1)
def _library_function():
    if os.environ.get("REDWOOD_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        library = ctypes.CDLL(str(build()))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:   # no cache, no cc
        log.info("native sampler unavailable (%s); the numpy sampler is used", error)
        return None
    function = library.redwood_sample_head
    function.restype = ctypes.c_int64
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                         ctypes.c_double, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return function


def build(directory: Path | None = None) -> Path:
    """The compiled library's path, compiling it first if this machine has none yet.
    Raises RuntimeError when no compiler is found or it fails."""
    from filelock import FileLock

    from redwood.cache_dirs import cache_root

    compiler = os.environ.get("CC") or "cc"
    found = shutil.which(compiler)
    if found is None:
        raise RuntimeError(f"no C compiler {compiler!r} on PATH")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, found.encode(), " ".join(FLAGS).encode(),
                                     platform.machine().encode(), sys.platform.encode()]))
    directory = Path(directory) if directory is not None else cache_root() / "native"
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"plain_sampling-{key.hexdigest()[:16]}.so"
    with FileLock(str(target) + ".lock"):
        if target.exists():
            return target
        with tempfile.TemporaryDirectory(dir=directory) as scratch:
            built = Path(scratch) / target.name
            result = subprocess.run([found, *FLAGS, "-o", str(built), str(SOURCE), "-lm"],
                                    capture_output=True, text=True, timeout=120)
            if result.returncode != 0:
                raise RuntimeError(f"{compiler} failed on {SOURCE.name}: "
                                   f"{result.stderr.strip()[-400:]}")
            os.replace(built, target)              # whole or absent, never half-written
    return target
