"""What a benchmark runs on: the model pair, the prompts, the acceptance vectors, the latency
profile and the trees, each with a line saying where it came from.

Sources, in order of precedence:
- acceptance vectors: `--acceptance` files; else the tuned bundle's (`presets.find_bundle`);
  else, in `--quick` mode, measured in-process by `calibrate.calibrate` on the calibration
  split; else an error saying how to get one.
- latency profile: `--profile`; else the bundle's; else (`--quick`) the shipped sample
  profile; else none (the chain then takes the sequoia tree's depth).
- sequoia tree: `--tree FILE`; else the bundle's tree for the nearest temperature (when no
  `--acceptance`/`--profile` overrides it); else planned by `planner.choose_tree` from the
  vector and the profile.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from redwood.errors import RedwoodError
from redwood.plan.formats import Acceptance, Profile
from redwood.plan.tree import Tree

QUICK_PROMPT_TOKENS = 48        # tiny models: keep the last 48 byte-tokens of each prompt


class ByteTokenizer:
    """Text -> ids for the tiny quick pair: each UTF-8 byte b becomes 2 + b mod (V - 2), so
    HumanEval prompts map into a small vocabulary (ids 0 and 1 are BOS and EOS)."""

    chat_template = None

    def __init__(self, vocab_size: int, keep_last: int = QUICK_PROMPT_TOKENS):
        self.vocab_size, self.keep_last = vocab_size, keep_last

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        ids = [2 + b % (self.vocab_size - 2) for b in text.encode("utf-8")]
        return {"input_ids": ids[-self.keep_last:]}


@dataclass
class Pair:
    """The models under test and how to turn text into their token ids."""
    target: object
    draft: object
    tokenizer: object
    name: str                              # shipped pair name, "quick-tiny", or the paths
    bundle_pair: str | None                # pair name for the shipped bundle lookup, if any
    quick: bool = False
    backend: str = "hf"                    # "hf" (models) or "llamacpp" (LlamaCppBackends)

    def encode(self, texts: list[str]) -> list[torch.Tensor]:
        from redwood.prompts import encode_prompt

        return [encode_prompt(self.tokenizer, text) for text in texts]


def quick_pair() -> Pair:
    """The tiny random pair of `redwood.models.tiny_random` (shared small vocabulary, built
    in-process)."""
    from redwood.models.tiny_random import QUICK_VOCAB, tiny_pair

    target, draft = tiny_pair()
    return Pair(target, draft, ByteTokenizer(QUICK_VOCAB),
                "quick-tiny (redwood.models.tiny_random.tiny_pair)", None, quick=True)


def load_models(model_config, bundle=None) -> Pair:
    """The pair a textgen.ModelConfig names (the shipped pair by default), on the runtime its
    `backend` names (models.runtime.choose_backend resolves "auto"). On transformers a tuned
    bundle's draft quantisation applies unless the config sets one, and the kernels are this
    machine's first-use choice (--kernels auto; the bundle's fixed fast-linear rule only with
    --kernels stock). On llama.cpp the GGUF files run as they are."""
    from dataclasses import replace

    from redwood.models.pair import load_pair
    from redwood.models.runtime import choose_backend

    if model_config.model is not None and (model_config.target or model_config.draft):
        raise RedwoodError("give either --model or --target/--draft, not both")
    backend = choose_backend(getattr(model_config, "backend", "hf"), model_config.target,
                             model_config.draft, model_config.device)
    if backend == "llamacpp":
        return _load_llamacpp(model_config)
    if bundle is not None:
        model_config = replace(
            model_config, draft_quantize=model_config.draft_quantize or bundle.draft_quantize,
            # the bundle's fixed 4-64-row rule only where this machine's choice is not made
            fast_linear=getattr(model_config, "fast_linear", False) or (
                bundle.fast_linear and getattr(model_config, "kernels", "auto") == "stock"))
    fast_linear = getattr(model_config, "fast_linear", False)
    target, draft, tokenizer = load_pair(
        model_config.model, target=model_config.target, draft=model_config.draft,
        dtype=model_config.dtype, device=model_config.device,
        draft_quantize=model_config.draft_quantize, fast_linear=fast_linear)
    kernels = None
    if not fast_linear and getattr(model_config, "kernels", "auto") == "auto":
        from redwood.measure.machine_profile import choose_kernels, routing_text

        # every method (redwood's, transformers' generate and assisted generation) runs on
        # these same model objects, so all of them get the kernels chosen here
        kernels = choose_kernels(target, draft)
    explicit = model_config.target is not None
    name = (f"target {model_config.target}, draft {model_config.draft}" if explicit
            else (model_config.model or "qwen2.5-coder"))
    extras = [f"draft {model_config.draft_quantize}"] if model_config.draft_quantize else []
    extras += ["fast linear"] if fast_linear else []
    extras += [f"kernels: oneDNN for {m} rows {routing_text(r) or 'none'}, F.linear otherwise"
               for m, r in (kernels or {}).items()]
    if extras:
        name += f" ({', '.join(extras)})"
    return Pair(target, draft, tokenizer, name, None if explicit else (model_config.model or
                                                                      "qwen2.5-coder"))


def _load_llamacpp(model_config) -> Pair:
    """The pair on llama.cpp (models.runtime.load_models): two LlamaCppBackends."""
    from redwood.models.runtime import load_models as load_on_backend

    loaded = load_on_backend(model_config.model, target=model_config.target,
                             draft=model_config.draft, backend="llamacpp",
                             dtype=model_config.dtype, device=model_config.device,
                             draft_quantize=model_config.draft_quantize,
                             fast_linear=getattr(model_config, "fast_linear", False))
    explicit = model_config.target is not None
    target, draft = loaded.target, loaded.draft
    files = f"target {target.name} ({target.dtype_name}), draft {draft.name} ({draft.dtype_name})"
    name = files if explicit else f"{model_config.model or 'qwen2.5-coder'}: {files}"
    return Pair(target, draft, loaded.tokenizer, f"{name}; llama.cpp backend",
                None if explicit else (model_config.model or "qwen2.5-coder"),
                backend="llamacpp")


# --- acceptance vectors, profile, trees ----------------------------------------------------

@dataclass
class Vector:
    """An acceptance vector chosen for one benchmark setting."""
    acceptance: Acceptance
    source: str                 # where it came from (file, bundle, measured)
    note: str = ""              # how it differs from the setting asked for, if it does

    @property
    def p(self):
        return self.acceptance.p

    def describe(self) -> str:
        a = self.acceptance
        text = (f"{self.source} (T={a.temperature}, top_p={a.top_p}, "
                f"{a.extra.get('method', 'sequoia')}, {a.steps} steps)")
        return text + (f"; {self.note}" if self.note else "")


@dataclass
class PlanInputs:
    """Vectors, profile and tree source for a benchmark, with their provenance."""
    vectors: list[tuple[Acceptance, str]]          # (vector, source)
    profile: Profile | None
    profile_source: str
    tree_file: Tree | None = None                  # --tree FILE
    tree_file_source: str = ""
    bundle: object = None                          # presets.Bundle used for trees, if any
    max_budget: int = 32
    max_depth: int = 12
    notes: list[str] = field(default_factory=list)

    def vector(self, temperature: float, top_p: float, method: str = "sequoia") -> Vector:
        """The vector measured nearest to (temperature, top_p) for `method` (sequoia or
        specinfer); falls back to the sequoia vector, saying so."""
        if not self.vectors:
            raise RedwoodError("no acceptance vector: run `redwood tune` (a bundle) or pass "
                               "--acceptance FILE [FILE ...] (from `redwood calibrate`)")
        kind = [v for v in self.vectors if _method(v[0]) == method]
        fallback = ""
        if not kind:
            kind = [v for v in self.vectors if _method(v[0]) == "sequoia"] or self.vectors
            fallback = f"no {method} vector, used the {_method(kind[0][0])} one"
        acc, source = min(kind, key=lambda v: (_distance(v[0].temperature, temperature),
                                               _distance(v[0].top_p, top_p),
                                               v[0].temperature or 0.0))
        notes = [fallback] if fallback else []
        if acc.temperature is not None and acc.temperature != temperature:
            notes.append(f"nearest temperature {acc.temperature} (asked {temperature})")
        if acc.top_p is not None and acc.top_p != top_p:
            notes.append(f"measured at top_p={acc.top_p} (asked {top_p})")
        return Vector(acc, source, "; ".join(notes))

    def vector_or_none(self, temperature: float, top_p: float, method: str = "sequoia"):
        return self.vector(temperature, top_p, method) if self.vectors else None

    def sequoia_tree(self, temperature: float, top_p: float) -> tuple[Tree, str]:
        """(tree, where it came from) for sequoia at this setting."""
        from redwood.plan.planner import choose_tree

        if self.tree_file is not None:
            return self.tree_file, self.tree_file_source
        if self.bundle is not None:
            entry = self.bundle.entry(temperature)
            return (self.bundle.tree(temperature),
                    f"tuned bundle {self.bundle.directory} (tree-{entry.temperature:g}: "
                    f"n={entry.budget}, d={entry.depth})")
        if self.profile is None:
            raise RedwoodError("sequoia needs a tree: pass --tree FILE, a tuned bundle "
                               "(--tree auto / DIR), or --profile P.json to plan one")
        vector = self.vector(temperature, top_p)
        choice = choose_tree(vector.p, self.profile, self.max_budget, self.max_depth)
        return choice.tree, (f"planned: choose_tree(vector, profile, max_budget="
                             f"{self.max_budget}, max_depth={self.max_depth}) -> "
                             f"n={choice.budget}, d={choice.depth}")

    def adaptive_tree(self, temperature: float, top_p: float) -> tuple[Tree, float, str]:
        """(max tree, draft_confidence, where they came from) for sequoia_adaptive."""
        from redwood.plan.adaptive import plan_adaptive
        from redwood.plan.planner import choose_tree

        if self.bundle is not None and self.bundle.entry(temperature).adaptive_tree:
            tree, threshold = self.bundle.drafting(temperature)
            return tree, threshold, f"tuned bundle {self.bundle.directory} (adaptive)"
        if self.profile is None or not self.vectors:
            raise RedwoodError("sequoia_adaptive needs a tuned bundle with adaptive trees or a "
                               "profile and acceptance vectors (--profile, --acceptance); or "
                               "leave it out with --methods")
        p = self.vector(temperature, top_p).p
        static = choose_tree(p, self.profile, self.max_budget, self.max_depth)
        plan = plan_adaptive(p, self.profile, static, self.max_budget, self.max_depth)
        return plan.tree, plan.draft_confidence, (
            f"plan_adaptive(vector, profile): marginal {plan.marginal_ms:.1f} ms / "
            f"{plan.ms_per_token:.1f} ms per token")

    def chain_tree(self, temperature: float, top_p: float, sequoia: Tree) -> tuple[Tree, str]:
        """The chain length our objective picks with W = 1 (needs the profile)."""
        from redwood.plan.planner import choose_tree
        from redwood.plan.tree import chain

        if self.profile is None or not self.vectors:
            return chain(sequoia.num_levels), "no profile or vector: the sequoia tree's depth"
        p1 = self.vector(temperature, top_p).p[:1]
        choice = choose_tree(p1, self.profile, self.max_budget, self.max_depth)
        return choice.tree, (f"choose_tree(p[:1], profile) -> n={choice.budget} "
                             f"(predicted {choice.speedup:.2f}x)")


def _method(acceptance: Acceptance) -> str:
    return acceptance.extra.get("method", "sequoia")


def _distance(measured, asked) -> float:
    return abs(measured - asked) if measured is not None else float("inf")


def plan_inputs(pair: Pair, acceptance_files=(), profile_file=None, tree_spec=None,
                max_budget: int = 32, max_depth: int = 12, temperatures=(0.0,),
                quick_seed: int = 0, measure_quick: bool = True) -> PlanInputs:
    """Gather vectors, profile and tree source for `pair` (see the module doc for the order)."""
    from redwood.measure import bundles as presets

    vectors = [(Acceptance.load(path), f"--acceptance {path}") for path in acceptance_files]
    profile, profile_source = None, "none"
    if profile_file:
        profile, profile_source = Profile.load(profile_file), f"--profile {profile_file}"
    inputs = PlanInputs(vectors, profile, profile_source, max_budget=max_budget,
                        max_depth=max_depth)
    bundle = _bundle(tree_spec, pair)
    if tree_spec is not None and bundle is None:
        inputs.tree_file = presets.resolve_tree(tree_spec, 0.0, pair.bundle_pair, pair.backend)
        inputs.tree_file_source = f"--tree {tree_spec}"
    if bundle is not None:
        if not vectors:
            inputs.vectors = [(Acceptance.load(bundle.directory / e.acceptance),
                               f"tuned bundle {bundle.directory / e.acceptance}")
                              for e in bundle.entries]
        if profile is None and (bundle.directory / "profile.json").is_file():
            inputs.profile = Profile.load(bundle.directory / "profile.json")
            inputs.profile_source = f"tuned bundle {bundle.directory / 'profile.json'}"
        if not vectors and not profile_file:
            inputs.bundle = bundle
    if pair.quick and measure_quick:
        _measure_quick(inputs, pair, temperatures, quick_seed)
    return inputs


def _bundle(tree_spec, pair: Pair):
    """The tuned bundle to use: --tree auto/DIR names one; with no --tree, the shipped
    bundle of the pair if there is one."""
    from redwood.measure import bundles as presets

    if pair.quick:
        return None
    if tree_spec is not None:
        return presets.find_bundle(tree_spec, pair.bundle_pair, pair.backend)
    try:
        return presets.find_bundle("auto", pair.bundle_pair, pair.backend)
    except RedwoodError:
        return None


def _measure_quick(inputs: PlanInputs, pair: Pair, temperatures, seed: int) -> None:
    """--quick: calibrate (sequoia and specinfer rules) and profile the tiny pair in-process."""
    from redwood.measure.calibrate import calibrate
    from redwood.plan.formats import sample_profile_path
    from redwood.prompts import humaneval_prompts

    if not inputs.vectors:
        prompts = pair.encode(humaneval_prompts("calibration", limit=2))
        for method in ("sequoia", "specinfer"):
            for t in sorted(set(temperatures)):
                acc = calibrate(pair.target, pair.draft, prompts, t, method=method, width=8,
                                max_new_tokens=16, seed=seed, progress=False,
                                stop_on_eos=False, dataset="humaneval calibration (bytes)")
                inputs.vectors.append((acc, "measured in-process (quick: calibrate on 2 "
                                            "calibration-split prompts x 16 tokens, width 8)"))
    if inputs.profile is None:
        # The tiny draft costs as much as the tiny target, so its own profile makes every
        # tree lose; the shipped sample profile (2-core CPU shape) makes the planner pick
        # real trees, which is what a pipeline check needs.
        inputs.profile = Profile.load(sample_profile_path())
        inputs.profile_source = ("shipped sample profile (quick: stands in for the tiny pair, "
                                 "whose draft is as slow as its target)")


def predicted_rate(tree: Tree, expected: float, profile: Profile | None) -> float | None:
    """The planner's objective for a tree: expected tokens per second from the profile
    (None when the profile lacks this tree's size or a level width)."""
    from redwood.plan.planner import step_draft_ms

    if profile is None or len(tree) not in profile.target_ms:
        return None
    draft = step_draft_ms(tree, profile)
    return None if draft is None else 1000.0 * expected / (profile.target_ms[len(tree)] + draft)

