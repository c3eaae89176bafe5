"""redwood: hardware-aware tree speculative decoding (Sequoia).

The planner half (Tree, optimal_tree, choose_tree) is pure numpy and imports
without torch; the engine half is imported lazily on first use.
"""
from redwood.tree import Tree
from redwood.planner import choose_tree, dp_table, optimal_tree
from redwood.tree import chain, specinfer, star

__version__ = "0.1.0"

_LAZY = {
    "Engine": ("redwood.engine", "Engine"),
    "GenerationResult": ("redwood.engine", "GenerationResult"),
    "load_model": ("redwood.models", "load_model"),
    "load_pair": ("redwood.models", "load_pair"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'redwood' has no attribute {name!r}")


__all__ = ["Tree", "optimal_tree", "choose_tree", "dp_table", "chain", "star", "specinfer", "Engine", "GenerationResult",
           "load_model", "load_pair", "__version__"]
