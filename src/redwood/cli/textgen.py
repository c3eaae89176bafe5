"""Text in, text out: load a pair, encode a prompt, stream decoded text, report stats.

The CLI's `generate` and `demo` verbs are thin wrappers over these functions.
"""
from __future__ import annotations

from dataclasses import dataclass

from redwood.decode.engine import Engine
from redwood.decode.params import SamplingParams, check_draft_confidence
from redwood.decode.stats import GenerationResult
from redwood.errors import RedwoodError
from redwood.prompts import assistant_turn_ids, encode_prompt


@dataclass
class ModelConfig:
    """Which models to load and how."""
    model: str | None = None          # shipped pair name (default qwen2.5-coder)
    target: str | None = None         # or explicit target + draft (HF dir or .gguf)
    draft: str | None = None
    tree: str | None = None           # tree JSON; None = the tree shipped for the default pair
    dtype: str | None = None
    device: str = "cpu"
    draft_quantize: str | None = None  # "int8": dynamic int8 draft (CPU), output stays exact
    fast_linear: bool = False          # CPU float32: oneDNN for 4-64-row matmuls (tree forwards)
    kernels: str = "auto"              # "auto": F.linear or oneDNN per row count, measured here
    grow: bool | None = None           # per-step trees grown best-first (decode/tree_growth.py);
                                       # None: where measured best (grows_by_default)
    draft_confidence: float | None = None  # pruning threshold; None = the bundle's, else 0
    backend: str = "auto"              # "auto" | "llamacpp" | "hf" (see redwood.models.runtime)
    bundle_latencies: bool = False     # plan a bundle's trees with its own profile, not this machine's
    drafter: str | None = "model"      # "model": the draft model; "ngram": prompt lookup (free
                                       # drafts); "hybrid": both in one tree, chosen per step;
                                       # "auto": per temperature; None: the CLI's default
                                       # (default_drafter)


def default_drafter(drafter: str | None, backend: str, tree_file: bool = False) -> str:
    """The drafter asked for, else the default: prompt lookup on llama.cpp (free drafts, each
    step sized on this machine's live costs, plain steps where nothing matches well), the
    draft model on the transformers backend (grown trees there) and wherever a tree JSON was
    given (`--tree FILE`: a tree for the draft model).

    Why not the planner's choice (`auto`) on llama.cpp: the draft model's trees are chosen from
    the first-use profile and the bundle's acceptance, and on the 2-core CPUs measured that
    choice never beat plain llama-server end to end, while prompt lookup drafts only what it
    expects to pay on the request's live costs (README, "a third EPYC": the batched server with
    the draft model planned no tree and measured 0.94-0.97x plain llama-server, prompt lookup
    1.04-1.14x on prompts no server had seen)."""
    if drafter is not None:
        return drafter
    return "ngram" if backend == "llamacpp" and not tree_file else "model"


def load_engine(config: ModelConfig, progress: bool = True, temperature: float = 0.0):
    """(engine, tokenizer) for a model config; the tree is validated before the models load.

    config.tree: None (the shipped default tree), a tree JSON, a tuned bundle directory or
    "auto" (the bundle in $REDWOOD_BUNDLE, else the one shipped for the pair); from a bundle
    the tree tuned for the temperature nearest `temperature` is used (its adaptive tree and
    draft_confidence when the bundle has them, see Bundle.drafting), and its draft
    quantisation and fast-linear setting too (the profile it was tuned on was measured so),
    unless config.draft_quantize says otherwise.
    """
    from dataclasses import replace

    from redwood.measure.bundles import find_bundle, is_bundle_dir, resolve_tree, shipped_bundle_dir
    from redwood.models.runtime import choose_backend, load_models
    from redwood.models.shipped import DEFAULT_PAIR

    if config.model is not None and (config.target or config.draft):
        raise RedwoodError("give either --model or --target/--draft, not both")
    pair = None if config.target else (config.model or DEFAULT_PAIR)
    backend = choose_backend(config.backend, config.target, config.draft, config.device)
    if config.tree is None and pair is not None \
            and is_bundle_dir(shipped_bundle_dir(pair, backend=backend)):
        config = replace(config, tree="auto")      # the shipped pair: its tuned bundle
    tree, confidence, bundle = None, config.draft_confidence, None
    draft_quantize, fast_linear = config.draft_quantize, config.fast_linear
    if config.tree is not None:
        bundle = find_bundle(config.tree, pair, backend)
        if bundle is not None:
            tree, confidence = bundle.drafting(temperature, config.draft_confidence)
            if backend == "hf":
                draft_quantize = draft_quantize or bundle.draft_quantize
                # the bundle's fixed rule where its own latencies are used (they were measured
                # so) or this machine's choice is not wanted; else --kernels auto measures here
                fast_linear = fast_linear or (bundle.fast_linear and (
                    config.bundle_latencies or config.kernels == "stock"))
        else:
            tree = resolve_tree(config.tree, temperature, pair, backend)
    tree_file = config.tree is not None and bundle is None
    config = replace(config, drafter=default_drafter(config.drafter, backend, tree_file))
    check_draft_confidence(confidence or 0.0)          # before minutes of model loading
    loaded = load_models(config.model, target=config.target, draft=config.draft, backend=backend,
                         dtype=config.dtype, device=config.device, draft_quantize=draft_quantize,
                         progress=progress, fast_linear=fast_linear)
    if backend == "hf" and config.kernels == "auto" and not fast_linear:
        from redwood.measure.machine_profile import choose_kernels

        choose_kernels(loaded.target, loaded.draft, progress)
    engine = Engine(loaded.target, loaded.draft, tree, confidence or 0.0)
    if config.drafter == "ngram":
        use_ngram_drafter(engine, progress, bundle, assistant_turn_ids(loaded.tokenizer))
    elif config.drafter in ("hybrid", "auto"):
        if config.drafter == "auto" and bundle is None:
            raise RedwoodError("--drafter auto picks a drafter per temperature from a tuned "
                               "bundle (--tree auto or a bundle directory); give one, or "
                               "--drafter model|ngram|hybrid")
        use_hybrid_drafter(engine, bundle, None if bundle is not None else tree, progress,
                           auto=config.drafter == "auto", bundle_latencies=config.bundle_latencies,
                           chat_turn=assistant_turn_ids(loaded.tokenizer))
    elif bundle is not None and not config.bundle_latencies:
        from redwood.measure.machine_profile import machine_profile

        # This machine's costs: plan the bundle's acceptance vectors for them, and govern
        # each request with them (speculate only while it pays).
        engine.profile = machine_profile(engine.target_backend, engine.draft_backend,
                                         progress=progress)
        engine.tree, engine.draft_confidence = bundle_drafting(bundle, engine, config)(temperature)
    if config.grow or (config.grow is None and grows_by_default(config, backend, bundle)):
        use_growth(engine, bundle, progress)
        if bundle is not None:
            engine.tree = bundle_drafting(bundle, engine, config)(temperature)[0]
    return engine, loaded.tokenizer


def use_ngram_drafter(engine, progress: bool = True, bundle=None,
                      chat_turn: tuple[int, ...] = ()) -> None:
    """Draft by prompt lookup: free proposals, each step's tree sized by the drafter's cost
    model on this machine's t(n) (measured once, cached; read at the request's context where
    the profile timed several, as on llama.cpp) and corrected by the request's live costs,
    so the drafter decides every step itself (no governor: NgramDrafter.sizes_itself); its
    acceptance priors from the bundle's n-gram calibration when it has one; chat_turn: the ids
    opening the assistant's turn of the model's chat template (chat requests' own pool)."""
    from redwood.decode.ngram_drafter import COPY_DEPTH, NgramDrafter
    from redwood.decode.ngram_trees import ngram_budget_tree
    from redwood.measure.machine_profile import machine_profile
    from redwood.measure.ngram_calibration import acceptance_model

    engine.profile = machine_profile(engine.target_backend, engine.draft_backend, progress=progress)
    engine.drafter = NgramDrafter(target_ms=engine.profile.target_ms,
                                  target_ms_by_context=engine.profile.target_ms_by_context,
                                  model=acceptance_model(bundle, learned=True,
                                                         chat_turn=chat_turn),
                                  max_length=COPY_DEPTH)
    engine.tree, engine.draft_confidence = ngram_budget_tree(depth=COPY_DEPTH), 0.0


def attach_ngram_memory(engine, max_tokens: int) -> bool:
    """Give the engine's n-gram drafter (or a hybrid's n-gram part) a memory of earlier answers
    of at most `max_tokens` tokens (decode/ngram_memory.py), shared by every request the engine
    serves. Returns whether there was an n-gram drafter to give it to."""
    from redwood.decode.ngram_memory import NgramMemory

    drafter = engine.drafter
    parts = [p for p in (drafter, getattr(drafter, "ngram", None)) if hasattr(p, "use_memory")]
    if max_tokens <= 0 or not parts:
        return False
    memory = NgramMemory(max_tokens=max_tokens)
    for part in parts:
        part.memory = memory
    return True


def use_hybrid_drafter(engine, bundle=None, tree=None, progress: bool = True,
                       auto: bool = False, bundle_latencies: bool = False,
                       chat_turn: tuple[int, ...] = ()) -> None:
    """Draft with both: n-gram continuations grafted onto the draft model's tree, each step
    spent where this machine's costs and the request's live acceptance say it pays
    (decode/hybrid_drafter.py). The model's trees: the bundle's acceptance vectors planned for
    this machine, per temperature (else `tree`, or the default tree). auto: per temperature,
    free drafts alone where no model tree pays on this machine (measure/hybrid_plans.py)."""
    from redwood.decode.hybrid_drafter import hybrid_drafting
    from redwood.measure.hybrid_plans import hybrid_plans
    from redwood.measure.machine_profile import machine_profile
    from redwood.measure.ngram_calibration import acceptance_model

    if engine.draft_backend is None:
        raise RedwoodError("--drafter hybrid needs a draft model")
    engine.profile = machine_profile(engine.target_backend, engine.draft_backend, progress=progress)
    plans = hybrid_plans(engine.profile, bundle, tree, auto, bundle_latencies)
    temperatures = [e.temperature for e in bundle.entries] if bundle is not None else [0.0]
    engine.drafter, engine.tree = hybrid_drafting(engine, plans, engine.profile, temperatures,
                                                  acceptance=acceptance_model(
                                                      bundle, learned=True, chat_turn=chat_turn))
    engine.draft_confidence = 0.0


def grows_by_default(config: ModelConfig, backend: str, bundle) -> bool:
    """Per-step trees unless asked otherwise where they were measured best: the transformers
    backend, the draft-model drafter, a tuned bundle planned for this machine and no explicit
    pruning threshold (README's transformers table: ahead of the governed tree in every
    column). On llama.cpp no draft-model tree pays on the 2-core CPUs measured, so either way
    decodes plainly there; --grow asks for it anywhere, --no-grow never."""
    return (backend == "hf" and config.drafter == "model" and bundle is not None
            and not config.bundle_latencies and config.draft_confidence is None)


def use_growth(engine, bundle=None, progress: bool = True) -> None:
    """Grow each step's tree best-first inside the request's tree (decode/tree_growth.py) on
    this machine's profile, with the bundle's calibrated acceptance by draft probability."""
    from redwood.measure.growth_plans import growth_rule
    from redwood.measure.machine_profile import machine_profile

    if not hasattr(engine.drafter, "growth"):
        raise RedwoodError("--grow applies to the draft-model drafter (--drafter model)")
    if engine.profile is None:
        engine.profile = machine_profile(engine.target_backend, engine.draft_backend,
                                         progress=progress)
    engine.drafter.growth = growth_rule(engine.profile, bundle)
    engine.draft_confidence = 0.0


def bundle_drafting(bundle, engine, config: ModelConfig):
    """temperature -> (tree, draft_confidence) from a tuned bundle: its acceptance vectors
    planned against this machine's profile (engine.profile, see load_engine), or with
    config.bundle_latencies the bundle's own trees. When the engine grows its trees (load_engine
    gave its drafter a growth rule): the largest tree a step may grow into
    (measure/growth_plans.py), no pruning threshold."""
    import functools

    if getattr(engine.drafter, "growth", None) is not None and engine.profile is not None:
        from redwood.measure.growth_plans import growth_trees

        trees = growth_trees(engine.profile, bundle)
        return lambda temperature: (trees(temperature), 0.0)

    if config.bundle_latencies or engine.profile is None:
        return functools.lru_cache(maxsize=None)(functools.partial(
            bundle.drafting, draft_confidence=config.draft_confidence))
    from redwood.measure.machine_profile import replan

    return functools.lru_cache(maxsize=None)(functools.partial(
        replan, bundle, profile=engine.profile, draft_confidence=config.draft_confidence))


def stream_text(engine: Engine, tokenizer, prompt: str, params: SamplingParams,
                chat: bool = False, on_text=None, method: str = "sequoia",
                stop_on_eos: bool = True) -> tuple[GenerationResult, str]:
    """Generate, calling on_text(piece) as text becomes final; returns (result, full text).

    params.stop ends the text at the first stop string (the engine knows only tokens); the
    result then holds the tokens generated up to that step."""
    from redwood.decode.detokenize import IncrementalText

    ids = encode_prompt(tokenizer, prompt, chat)
    text = IncrementalText(tokenizer, list(params.stop))
    stream = engine.stream(ids, params.max_new_tokens, temperature=params.temperature,
                           top_p=params.top_p, top_k=params.top_k, seed=params.seed,
                           method=method, stop_on_eos=stop_on_eos)
    try:
        for new_tokens in stream:
            piece = text.add(new_tokens)
            if piece and on_text:
                on_text(piece)
            if text.stopped:
                break
    finally:
        stream.close()      # a no-op once finished; ends the engine's stream after a stop string
    rest = text.finish()
    if rest and on_text:
        on_text(rest)
    return stream.result, text.text


def stats_lines(result: GenerationResult) -> list[str]:
    depth = ", ".join(f"{rate:.2f}" for rate in result.stats.acceptance_by_depth())
    stats = result.stats
    return [
        f"{len(result.tokens)} tokens in {result.decode_seconds:.2f} s "
        f"({result.tokens_per_second:.2f} tokens/s, " + (
            f"the target's prompt pass included: fused into the first verification; the draft's "
            f"prefill {result.prefill_seconds:.2f} s excluded)" if stats.fused_prefill else
            f"prefill {result.prefill_seconds:.2f} s excluded)"),
        f"{result.tokens_per_step:.2f} tokens per target forward over {stats.target_forwards} forwards "
        f"({result.method}" + (f"; {stats.draft_tokens_per_step:.2f} draft tokens checked per "
                               "forward)" if stats.tree_nodes else ")"),
        f"time: target {stats.target_seconds:.2f} s, draft {stats.draft_seconds:.2f} s, "
        f"other {stats.other_seconds:.2f} s",
    ] + ([f"acceptance by depth: {depth}"] if depth else [])
