"""The benchmark's methods for one sampling setting, each with its tree or schedule chosen
the way a user tuning for this machine would choose it.

- autoregressive: redwood's target-only loop;
- hf_generate: `transformers` `generate` with the target alone;
- hf_assisted_default: `transformers` assisted generation with its default schedule;
- hf_assisted_constant: assisted generation with a constant `num_assistant_tokens` k, the
  best k of a grid;
- chain: redwood's chain, its length planned by our own objective with W = 1;
- specinfer: redwood's specinfer verification on the best k x d tree of a grid;
- sequoia: the tuned (or given, or planned) tree.
- sequoia_adaptive: sequoia on the adaptive tree pruned by draft confidence (the bundle's,
  or redwood.plan.adaptive's plan from the profile and vector);
- sequoia_fixed: sequoia on a fixed, untuned tree (the shipped default tree unless
  BenchConfig.fixed_tree names one): what speculation with the model draft costs or gains
  where the tuned tree declines to speculate.
On the llama.cpp backend (LLAMACPP_METHODS) the baselines are llama-cpp-python's own
(bench.llamacpp_runners):
- llamacpp_plain: its high-level `Llama.generate` on the target alone;
- llamacpp_prompt_lookup: the same with its prompt-lookup speculative decoding
  (`LlamaPromptLookupDecoding`, num_pred_tokens=10, its default);
- llamacpp_prompt_lookup_best: the same at the best num_pred_tokens of a small grid,
  chosen per prompt set on its first prompt (bench.user_methods).
and redwood's defaults for a user on this machine (bench.user_methods): `ngram` (the n-gram
drafter, governed) and `sequoia_governed` (the tuned bundle re-planned for this machine's
profile, governed).
Grid choices are made per setting, measured on calibration-split prompts (never on the
evaluation prompts), or by the planner's objective when `select_prompts` is 0.
"""
from __future__ import annotations

import statistics

from redwood.bench.inputs import Pair, PlanInputs, predicted_rate
from redwood.bench.runners import AssistantSchedule, Setting, hf_runner, redwood_runner
from redwood.bench.specs import MethodSpec, Selection
from redwood.errors import RedwoodError
from redwood.plan.tree import Tree, chain, specinfer

METHODS = ("autoregressive", "hf_generate", "hf_assisted_default", "hf_assisted_constant",
           "chain", "specinfer", "sequoia", "sequoia_adaptive")
HF_METHODS = ("hf_generate", "hf_assisted_default", "hf_assisted_constant")
LLAMACPP_METHODS = ("llamacpp_plain", "autoregressive", "chain", "specinfer", "sequoia",
                    "sequoia_fixed", "sequoia_governed", "sequoia_grown", "ngram", "hybrid",
                    "llamacpp_prompt_lookup",
                    "llamacpp_prompt_lookup_best")
LOOKUP_GRID = (2, 4, 10)         # num_pred_tokens tried for llamacpp_prompt_lookup_best


def default_methods(backend: str = "hf") -> tuple[str, ...]:
    """The methods a bench runs on `backend` when --methods is not given."""
    return LLAMACPP_METHODS if backend == "llamacpp" else METHODS


def allowed_methods(backend: str = "hf") -> tuple[str, ...]:
    """Every method a bench may run on `backend` (redwood's run on both)."""
    if backend == "llamacpp":
        return LLAMACPP_METHODS + ("sequoia_adaptive",)
    return METHODS + ("sequoia_fixed", "sequoia_governed", "sequoia_grown", "ngram", "hybrid")


class MethodFactory:
    """Builds the MethodSpecs of each setting; engines are shared per distinct tree."""

    def __init__(self, pair: Pair, inputs: PlanInputs, hf_grid, specinfer_grid,
                 select_prompts: list, select_tokens: int, seed: int,
                 fixed_tree: str | None = None, lookup_grid=LOOKUP_GRID, lookup_tokens: int = 32):
        self.pair, self.inputs = pair, inputs
        self.lookup_grid, self.lookup_tokens = tuple(lookup_grid), int(lookup_tokens)
        self._profile = None                     # this machine's profile, measured on first use
        self.hf_grid, self.specinfer_grid = list(hf_grid), list(specinfer_grid)
        self.select_prompts, self.select_tokens, self.seed = select_prompts, select_tokens, seed
        self.fixed_tree = fixed_tree             # tree JSON for sequoia_fixed (None: default)
        self.selections: list[Selection] = []
        self._engines: dict = {}
        self._llamas: dict = {}                  # llama-cpp-python Llama per baseline

    def close(self) -> None:
        """Free the llama-cpp-python models the llama.cpp baselines loaded."""
        for model in self._llamas.values():
            model.close()
        self._llamas.clear()

    def engine(self, tree: Tree):
        from redwood.decode.engine import Engine

        return self.cached_engine(tuple(tree.parents),
                                  lambda: Engine(self.pair.target, self.pair.draft, tree))

    def cached_engine(self, key, build):
        """The engine built by build() for `key`, made once (bench.user_methods)."""
        if key not in self._engines:
            self._engines[key] = build()
        return self._engines[key]

    def machine_profile(self):
        """This machine's latency profile (measure.machine_profile: cached across runs)."""
        if self._profile is None:
            from redwood.measure.machine_profile import machine_profile

            self._profile = machine_profile(self.pair.target, self.pair.draft)
        return self._profile

    def machine_profile_source(self) -> str:
        sizes = sorted(self.machine_profile().target_ms)
        return (f"this machine's first-use profile, t(n) for n = {sizes[0]}..{sizes[-1]}, "
                f"t(1) = {self.machine_profile().target_ms[sizes[0]]:.1f} ms")

    def specs(self, setting: Setting, methods, prompt_set: str | None = None,
              first=None) -> list[MethodSpec]:
        """The methods' specs at `setting` for `prompt_set`, whose first prompt is `first`
        = (ids, seed) (the prompt-lookup grid is chosen on it)."""
        from redwood.bench import user_methods

        build = {"autoregressive": self._autoregressive, "hf_generate": self._hf_generate,
                 "hf_assisted_default": self._hf_default, "hf_assisted_constant": self._hf_constant,
                 "chain": self._chain, "specinfer": self._specinfer, "sequoia": self._sequoia,
                 "sequoia_adaptive": self._sequoia_adaptive, "sequoia_fixed": self._sequoia_fixed,
                 "llamacpp_plain": self._llamacpp_plain,
                 "llamacpp_prompt_lookup": self._llamacpp_prompt_lookup,
                 "ngram": lambda s: user_methods.ngram_spec(self, s),
                 "hybrid": lambda s: user_methods.hybrid_spec(self, s),
                 "sequoia_grown": lambda s: user_methods.sequoia_grown_spec(self, s),
                 "sequoia_governed": lambda s: user_methods.sequoia_governed_spec(self, s),
                 "llamacpp_prompt_lookup_best":
                     lambda s: user_methods.lookup_best_spec(self, s, prompt_set, first)}
        return [build[m](setting) for m in methods]

    def high_level_llama(self, kind: str):
        """The llama-cpp-python `Llama` of a llama.cpp baseline ("plain" or "lookup"), on the
        target's GGUF with the target backend's n_ctx and threads; loaded once."""
        from redwood.bench.llamacpp_runners import LOOKUP_TOKENS, HighLevelLlama

        if self.pair.backend != "llamacpp":
            raise RedwoodError("the llamacpp_* methods need the llama.cpp backend "
                               "(--backend llamacpp with GGUF models)")
        if kind not in self._llamas:
            target = self.pair.target
            self._llamas[kind] = HighLevelLlama(
                target.name, target.n_ctx, target.n_threads,
                prompt_lookup=LOOKUP_TOKENS if kind == "lookup" else None)
        return self._llamas[kind]

    # -- one builder per method -----------------------------------------------------------
    def _autoregressive(self, setting):
        return MethodSpec("autoregressive", "target only", redwood_runner(self.engine(chain(1)),
                          "autoregressive"), 1.0, chosen_by="baseline")

    def _hf_generate(self, setting):
        return MethodSpec("hf_generate", "target only", hf_runner(self.pair.target), 1.0,
                          chosen_by="baseline")

    def _hf_default(self, setting):
        return MethodSpec("hf_assisted_default", "default",
                          hf_runner(self.pair.target, self.pair.draft, AssistantSchedule()),
                          None, chosen_by="transformers' default assistant schedule")

    def _hf_constant(self, setting):
        vector = self.inputs.vector_or_none(setting.temperature, setting.top_p)
        candidates = []
        for k in self.hf_grid:
            tree = chain(k + 1)          # k drafted tokens verified in one target forward
            candidates.append(MethodSpec(
                "hf_assisted_constant", f"k={k}",
                hf_runner(self.pair.target, self.pair.draft, AssistantSchedule(k)),
                _expected(tree, vector), tree, vector=_describe(vector)))
        return self._select("hf_assisted_constant", setting, candidates)

    def _chain(self, setting):
        vector = self.inputs.vector_or_none(setting.temperature, setting.top_p)
        sequoia, _ = self.inputs.sequoia_tree(setting.temperature, setting.top_p)
        tree, how = self.inputs.chain_tree(setting.temperature, setting.top_p, sequoia)
        return MethodSpec("chain", f"n={len(tree)}", redwood_runner(self.engine(tree), "chain"),
                          _expected(tree, vector), tree, how, _describe(vector))

    def _specinfer(self, setting):
        vector = self.inputs.vector_or_none(setting.temperature, setting.top_p, "specinfer")
        candidates = []
        for k, d in self.specinfer_grid:
            tree = specinfer(k, d)
            candidates.append(MethodSpec("specinfer", f"{k}x{d}",
                                         redwood_runner(self.engine(tree), "specinfer"),
                                         _expected(tree, vector), tree, vector=_describe(vector)))
        return self._select("specinfer", setting, candidates)

    def _sequoia(self, setting):
        vector = self.inputs.vector_or_none(setting.temperature, setting.top_p)
        tree, how = self.inputs.sequoia_tree(setting.temperature, setting.top_p)
        return MethodSpec("sequoia", f"n={len(tree)} d={tree.num_levels}",
                          redwood_runner(self.engine(tree), "sequoia"),
                          _expected(tree, vector), tree, how, _describe(vector))

    def _sequoia_adaptive(self, setting):
        tree, threshold, how = self.inputs.adaptive_tree(setting.temperature, setting.top_p)
        return MethodSpec("sequoia_adaptive", f"n<={len(tree)} d<={tree.num_levels} c={threshold:.2f}",
                          redwood_runner(self.engine(tree), "sequoia", threshold), None, tree, how,
                          "none (pruned trees: no positional prediction)")

    def _sequoia_fixed(self, setting):
        from redwood.plan.tree import default_tree

        vector = self.inputs.vector_or_none(setting.temperature, setting.top_p)
        if self.fixed_tree is None:
            tree, how = default_tree(), "fixed, not tuned: the shipped default tree " \
                                        "(redwood/data/default_tree.json)"
        else:
            tree, how = Tree.load(self.fixed_tree), f"fixed, not tuned: {self.fixed_tree}"
        return MethodSpec("sequoia_fixed", f"n={len(tree)} d={tree.num_levels}",
                          redwood_runner(self.engine(tree), "sequoia"),
                          _expected(tree, vector), tree, how, _describe(vector))

    def _llamacpp_plain(self, setting):
        from redwood.bench.llamacpp_runners import llama_runner

        model = self.high_level_llama("plain")
        return MethodSpec("llamacpp_plain", "Llama.generate", llama_runner(model), 1.0,
                          chosen_by=f"baseline: llama-cpp-python {model.describe()}")

    def _llamacpp_prompt_lookup(self, setting):
        from redwood.bench.llamacpp_runners import llama_runner

        model = self.high_level_llama("lookup")
        return MethodSpec("llamacpp_prompt_lookup", f"lookup k={model.prompt_lookup}",
                          llama_runner(model), None,
                          chosen_by=f"llama-cpp-python's default prompt lookup: {model.describe()}",
                          vector="none (prompt lookup: no draft model, no positional prediction)")

    # -- grid selection -------------------------------------------------------------------
    def _select(self, method, setting, candidates: list[MethodSpec]) -> MethodSpec:
        if len(candidates) == 1:
            candidates[0].chosen_by = "the only grid entry"
            return candidates[0]
        if self.select_prompts:
            best = self._select_measured(method, setting, candidates)
        else:
            best = self._select_predicted(method, setting, candidates)
        return best

    def _select_measured(self, method, setting, candidates):
        how = (f"measured: best median tokens/s on {len(self.select_prompts)} calibration-split "
               f"prompt(s) x {self.select_tokens} tokens")
        selection = Selection(method, setting, how)
        rates = []
        for spec in candidates:
            tps = [spec.run(ids, setting, self.seed + i, self.select_tokens).tokens_per_second
                   for i, ids in enumerate(self.select_prompts)]
            rates.append(statistics.median(tps))
            selection.candidates.append({"config": spec.config, "tokens_per_second": rates[-1],
                                         "predicted_tokens_per_step": spec.predicted})
        best = candidates[max(range(len(candidates)), key=lambda i: rates[i])]
        return self._chosen(selection, best, how)

    def _select_predicted(self, method, setting, candidates):
        how = "planner objective: predicted tokens/s from the vector and the profile"
        selection = Selection(method, setting, how)
        rates = []
        for spec in candidates:
            rate = None if spec.predicted is None else \
                predicted_rate(spec.tree, spec.predicted, self.inputs.profile)
            rates.append(rate)
            selection.candidates.append({"config": spec.config,
                                         "predicted_tokens_per_second": rate,
                                         "predicted_tokens_per_step": spec.predicted})
        if all(r is None for r in rates):
            best, how = candidates[0], "no profile covers the grid: its first entry"
        else:
            best = candidates[max((i for i, r in enumerate(rates) if r is not None),
                                  key=lambda i: rates[i])]
        return self._chosen(selection, best, how)

    def _chosen(self, selection, best, how):
        selection.chosen, selection.by = best.config, how
        self.selections.append(selection)
        best.chosen_by = how
        return best


def _expected(tree: Tree, vector) -> float | None:
    return None if vector is None else tree.expected_length(vector.p)


def _describe(vector) -> str:
    return "none (no acceptance vector given)" if vector is None else vector.describe()


def parse_specinfer_grid(text) -> list[tuple[int, int]]:
    """'2x2,2x3' or ['2x2', '3x1'] -> [(2, 2), (2, 3)]; RedwoodError on anything else."""
    items = text.split(",") if isinstance(text, str) else list(text)
    grid = []
    for item in items:
        if isinstance(item, tuple):
            k, d = item
        else:
            parts = str(item).strip().lower().split("x")
            if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
                raise RedwoodError(f"specinfer grid entry {item!r} is not KxD (e.g. 2x3)")
            k, d = int(parts[0]), int(parts[1])
        if k < 1 or d < 1:
            raise RedwoodError(f"specinfer grid entry {k}x{d}: k and d must be >= 1")
        grid.append((int(k), int(d)))
    if not grid:
        raise RedwoodError("the specinfer grid is empty; give entries like 2x2,2x3")
    return grid
