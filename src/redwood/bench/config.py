"""What a `redwood bench` run is asked to do: the BenchConfig (checked before any model
loads), the issue's full specification it is compared against, and the --quick defaults."""
from __future__ import annotations

from dataclasses import dataclass, field

from redwood.bench.methods import (LOOKUP_GRID, METHODS, allowed_methods, default_methods,
                                   parse_specinfer_grid)
from redwood.bench.prompt_sets import PROMPT_SETS, check_prompt_sets
from redwood.errors import RedwoodError

# The full specification; anything less is listed as a reduction in the output
# (the methods: those of the backend, bench.methods.default_methods).
FULL_SPEC = {"prompts": 20, "max_new_tokens": 128, "temperatures": (0.0, 0.6, 1.0),
             "top_ps": (1.0, 0.9), "methods": METHODS}
QUICK = {"prompts": 2, "max_new_tokens": 12, "hf_constant_grid": (2, 4),
         "specinfer_grid": ((2, 2), (3, 1)), "select_tokens": 8}


@dataclass
class BenchConfig:
    prompts: int = 20
    max_new_tokens: int = 128
    temperatures: tuple = (0.0, 0.6, 1.0)
    top_ps: tuple = (1.0, 0.9)
    methods: tuple = METHODS
    prompt_sets: tuple = ("humaneval",)   # bench.prompt_sets.PROMPT_SETS, each `prompts` long
    lookup_grid: tuple = LOOKUP_GRID      # num_pred_tokens for llamacpp_prompt_lookup_best
    hf_constant_grid: tuple = (2, 3, 4, 6, 8)
    specinfer_grid: tuple = ((2, 1), (2, 2), (2, 3), (3, 1), (3, 2), (4, 2))
    select_prompts: int = 1            # calibration-split prompts for grid choices (0: planner)
    select_tokens: int = 32
    seed: int = 0
    max_budget: int = 32               # planning limits when a tree is planned here
    max_depth: int = 12
    out_dir: str = "benchmarks/results"
    machine: str | None = None
    stem: str | None = None            # output file stem (default <machine>-<date>)
    backend: str = "hf"                # "hf" or "llamacpp" (resolved, never "auto")
    fixed_tree: str | None = None      # tree JSON for sequoia_fixed (None: the default tree)
    plots: bool = True
    quick: bool = False
    command: str = ""
    notes: list = field(default_factory=list)

    def check(self) -> None:
        """RedwoodError on bad input, before any model loads."""
        from redwood.decode.params import check_sampling
        from redwood.prompts import EVALUATION

        _positive(self.prompts, "--prompts")
        if self.prompts > len(EVALUATION):
            raise RedwoodError(f"--prompts {self.prompts}: the evaluation split has only "
                               f"{len(EVALUATION)} prompts")
        self.prompt_sets = check_prompt_sets(self.prompt_sets)
        for k in self.lookup_grid:
            _positive(k, "--lookup-grid entries")
        if not self.lookup_grid:
            raise RedwoodError("--lookup-grid is empty; give num_pred_tokens values like 2 4 10")
        _positive(self.select_tokens, "--select-tokens")
        if isinstance(self.select_prompts, bool) or not isinstance(self.select_prompts, int) \
                or not 0 <= self.select_prompts <= 40:
            raise RedwoodError("--select-prompts must be an integer in 0..40 (calibration split)")
        if not self.temperatures or not self.top_ps:
            raise RedwoodError("give at least one temperature and one top_p")
        for t in self.temperatures:
            for p in self.top_ps:
                check_sampling(self.max_new_tokens, t, p, 0)
        if self.backend not in ("hf", "llamacpp"):
            raise RedwoodError(f"bench backend must be 'hf' or 'llamacpp', got {self.backend!r}")
        allowed = allowed_methods(self.backend)
        unknown = [m for m in self.methods if m not in allowed]
        if unknown or not self.methods:
            other = [m for m in unknown if m in allowed_methods(
                "hf" if self.backend == "llamacpp" else "llamacpp")]
            hint = (f" ({', '.join(other)} run on the "
                    f"{'transformers' if self.backend == 'llamacpp' else 'llama.cpp'} backend: "
                    f"--backend {'hf' if self.backend == 'llamacpp' else 'llamacpp'})"
                    if other else "")
            raise RedwoodError(f"unknown method(s) {', '.join(unknown) or '(none given)'} for "
                               f"the {self.backend} backend; choose from "
                               f"{', '.join(allowed)}{hint}")
        if self.fixed_tree is not None and "sequoia_fixed" in self.methods:
            from redwood.plan.tree import Tree

            try:
                Tree.load(self.fixed_tree)
            except (OSError, ValueError) as err:
                raise RedwoodError(f"--fixed-tree {self.fixed_tree}: {err}") from None
        for k in self.hf_constant_grid:
            _positive(k, "--hf-constant-grid entries")
        self.specinfer_grid = tuple(parse_specinfer_grid(self.specinfer_grid))
        _positive(self.max_budget, "--max-budget")
        _positive(self.max_depth, "--max-depth")

    def reductions(self) -> list[str]:
        """How this run falls short of the issue's full specification."""
        out = []
        if self.quick:
            out.append("--quick: tiny random models, not the real pair (a pipeline check, "
                       "not a measurement)")
        if self.prompts < FULL_SPEC["prompts"]:
            out.append(f"{self.prompts} prompts instead of {FULL_SPEC['prompts']}")
        if self.backend == "llamacpp":
            missing = [s for s in PROMPT_SETS if s not in self.prompt_sets]
            if missing:
                out.append(f"prompt sets {', '.join(missing)} not run")
        if self.max_new_tokens < FULL_SPEC["max_new_tokens"]:
            out.append(f"{self.max_new_tokens} new tokens instead of {FULL_SPEC['max_new_tokens']}")
        full = {**FULL_SPEC, "methods": default_methods(self.backend)}
        for key, label in (("temperatures", "temperature"), ("top_ps", "top_p"),
                           ("methods", "method")):
            missing = [x for x in full[key] if x not in getattr(self, key)]
            if missing:
                out.append(f"{label}s {', '.join(map(str, missing))} not run")
        if "hf_assisted_constant" in self.methods and len(self.hf_constant_grid) == 1:
            out.append(f"assisted constant k fixed at {self.hf_constant_grid[0]} (no grid)")
        grids = (("hf_assisted_constant", self.hf_constant_grid),
                 ("specinfer", self.specinfer_grid))
        if self.select_prompts == 0 and any(m in self.methods and len(g) > 1 for m, g in grids):
            out.append("grid entries chosen by the planner's objective (predicted tokens/s), "
                       "not measured on calibration prompts")
        if "specinfer" in self.methods and len(self.specinfer_grid) == 1:
            k, d = self.specinfer_grid[0]
            out.append(f"specinfer fixed at {k}x{d} (no grid)")
        return out


def _positive(value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RedwoodError(f"{what} must be an integer >= 1, got {value!r}")


def quick_config(**overrides) -> BenchConfig:
    """A BenchConfig for --quick: tiny pair, few prompts and tokens, small grids."""
    config = BenchConfig(quick=True, machine="quick", **QUICK)
    for key, value in overrides.items():
        if value is not None:
            setattr(config, key, value)
    return config


def config_from_options(quick: bool, **options) -> BenchConfig:
    """A BenchConfig from CLI-style options (None = the default of the mode; the methods
    default to those of the backend)."""
    base = quick_config() if quick else BenchConfig()
    if options.get("methods") is None and options.get("backend"):
        base.methods = default_methods(options["backend"])
    for key, value in options.items():
        if value is None:
            continue
        if key in ("temperatures", "top_ps", "methods", "hf_constant_grid", "prompt_sets",
                   "lookup_grid"):
            value = tuple(value)
        setattr(base, key, value)
    base.check()
    return base
