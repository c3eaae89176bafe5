"""llama-cpp-python's native library, loaded once: its log routed into Python (kept for error
messages), argument checks made before a value reaches llama.cpp (which aborts the process on
some bad ones), and `llama_decode` with its codes turned into RedwoodError."""
from __future__ import annotations

import collections
import ctypes
import os
import sys

import numpy as np

from redwood.errors import RedwoodError

LLAMA_MAX_SEQ = 256          # llama.cpp's hard cap on sequence ids
GGML_LOG_ERROR = 4           # ggml_log_level (llama_cpp._logger's table predates DEBUG = 1)
_log: collections.deque = collections.deque(maxlen=64)
_state: dict = {}


def _on_log(level, text, _user_data):
    """llama.cpp's log: kept for error messages; echoed to stderr if REDWOOD_LLAMA_LOG is set."""
    text = text.decode("utf-8", errors="replace") if text else ""
    _log.append((level, text))
    if os.environ.get("REDWOOD_LLAMA_LOG"):
        sys.stderr.write(text)


def clear_log() -> None:
    """Forget what llama.cpp logged so far (call before a native call whose errors we report)."""
    _log.clear()


def native_errors() -> str:
    """The error lines llama.cpp logged since the last clear, for an exception message."""
    lines = [text.strip() for level, text in _log if level == GGML_LOG_ERROR and text.strip()]
    _log.clear()
    return (": " + "; ".join(lines[-3:])) if lines else ""


def llama_cpp_module():
    """The llama_cpp module, initialised once, with llama.cpp's log routed to `_on_log`
    (process-wide: llama.cpp has one log callback)."""
    try:
        import llama_cpp
    except ImportError:
        raise RedwoodError("the llama.cpp backend needs llama-cpp-python: "
                           "pip install llama-cpp-python==0.3.36 (builds llama.cpp from source)"
                           ) from None
    if not _state:
        _state["callback"] = llama_cpp.llama_log_callback(_on_log)   # keep it alive
        llama_cpp.llama_log_set(_state["callback"], ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
    return llama_cpp


def free_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                            # not Linux
        return os.cpu_count() or 1


def positive(value, what: str, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise RedwoodError(f"{what} must be a positive integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise RedwoodError(f"{what} = {value} is above llama.cpp's limit of {maximum}")
    return int(value)


def decode(llama, ctx, batch, what: str) -> None:
    """llama_decode(ctx, batch), raising RedwoodError (with llama.cpp's logged errors) on failure."""
    _log.clear()
    code = llama.llama_decode(ctx, batch)
    if code != 0:
        reason = {1: "no free cache slot (context full)", 2: "aborted",
                  -1: "invalid batch"}.get(code, "internal error")
        raise RedwoodError(f"llama_decode failed with code {code} ({reason}) while "
                           f"{what}{native_errors()}")
