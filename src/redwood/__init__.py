"""redwood: hardware-aware tree speculative decoding (Sequoia).

Packages follow the data flow: plan (pure numpy) -> decode (the loop, drafters,
verification) -> backends (model runtimes) -> measure / bench / serve / cli.
The planner half imports without torch; the engine half is imported lazily on first use.
"""
from redwood.plan.planner import choose_tree, dp_table, optimal_tree
from redwood.plan.tree import Tree, chain, specinfer, star

__version__ = "0.1.0"

_LAZY = {
    "Engine": ("redwood.decode.engine", "Engine"),
    "GenerationResult": ("redwood.decode.stats", "GenerationResult"),
    "SamplingParams": ("redwood.decode.params", "SamplingParams"),
    "load_model": ("redwood.models", "load_model"),
    "load_pair": ("redwood.models", "load_pair"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'redwood' has no attribute {name!r}")


__all__ = ["Tree", "optimal_tree", "choose_tree", "dp_table", "chain", "star", "specinfer", "Engine",
           "GenerationResult", "SamplingParams", "load_model", "load_pair", "__version__"]
