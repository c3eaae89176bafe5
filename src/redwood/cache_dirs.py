"""Where redwood keeps what it builds once per machine (models, profiles, native helpers)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else `$REDWOOD_CACHE`, else `$XDG_CACHE_HOME/redwood` (default ~/.cache/redwood)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("REDWOOD_CACHE"):
        return Path(os.environ["REDWOOD_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "redwood"
