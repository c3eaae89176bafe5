"""Building a BatchScheduler for `redwood serve --max-batch N` on the llama.cpp backend: the two
batch contexts, this machine's t(total tokens) profile (measured once, cached), each request's
acceptance vector (the tuned bundle's, by temperature) and the batch planner.
"""
from __future__ import annotations

import json
from pathlib import Path

from redwood.errors import RedwoodError
from redwood.plan.formats import Acceptance, Profile, sample_acceptance_path
from redwood.serve.batching import BatchScheduler

MAX_LANES = 16            # requests per context when --max-batch is left to the machine
CELLS_PER_LANE = 2048     # KV cells per request slot (prompt + max_tokens + one tree)
N_BATCH = 512             # tokens per decode: every tree of a step + prompt chunks
MAX_BUDGET, MAX_DEPTH = 16, 8
# How batch profiles are measured; part of the cache key, so a change re-measures. v2: minimum
# over more rounds (v1's median of 2 read t(1) = 52 ms for a 28 ms decode on a busy machine).
PROFILE_METHOD = "min-v2"
SMALL_SIZES = 32          # sizes up to this get ROUNDS_SMALL timed rounds, larger ROUNDS_LARGE
ROUNDS_SMALL, ROUNDS_LARGE = 6, 2


def batch_sizes(limit: int) -> list[int]:
    """Totals N the profile measures: every N to 16, then steps of 4 to 32, then x1.5 / x2
    (the planner only ever picks measured totals; large ones matter only at high load)."""
    sizes = list(range(1, 17)) + [20, 24, 28, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    return [n for n in sizes if n <= limit]


def choose_max_batch(profile: Profile, cap: int = MAX_LANES) -> int:
    """From the machine's profile: the batch size beyond which plain batched decoding stops
    paying (doubling the batch cuts the time per token by less than 10%), within 2..cap."""
    per_token = {n: t / n for n, t in profile.target_ms.items()}
    batch = 2
    while batch * 2 <= cap and batch * 2 in per_token and batch in per_token \
            and per_token[batch * 2] < 0.9 * per_token[batch]:
        batch *= 2
    return min(cap, batch)


def batch_profile(target, draft, sizes: list[int], progress: bool = True,
                  cache_dir=None) -> Profile:
    """t_target(N) and t_draft(w) on these contexts' backends, cached per machine and sizes
    (measure/machine_profile's key plus the sizes)."""
    from redwood.measure.machine_profile import (cached, load_matching, profile_dir, profile_key,
                                                 save_profile)

    # through JSON once: the key is compared with the one read back from the file
    key = json.loads(json.dumps(dict(profile_key(target.backend, draft.backend),
                                     batch_sizes=sizes, method=PROFILE_METHOD)))
    directory = profile_dir(cache_dir)

    def make(path):
        profile = measure_batch_profile(target.backend, draft.backend, sizes, progress)
        target.backend.reset()
        draft.backend.reset()
        return save_profile(profile, key, path)

    announce = (f"redwood: measuring batched forward times for {len(sizes)} sizes (first use; "
                f"cached in {directory})") if progress else ""
    return cached(directory, key, load_matching, make, announce, prefix="batch-",
                  fresh_thread=True)


def measure_batch_profile(target, draft, sizes: list[int], progress: bool = False) -> Profile:
    """t_target(N) and t_draft(w) (ms) on two backends: the MINIMUM over interleaved rounds,
    after a warm-up round that runs every size once.

    Why the minimum: on 2 cores another process's work makes a 2-thread llama_decode wait for a
    descheduled thread, so delays only ever add time and come in bursts (a 28 ms decode read
    50-3000 ms while a neighbour ran); the median of 2 rounds took t(1) = 52 ms, and the
    planner then saw speculation as nearly free. The steps being planned run on the same
    contexts and native decode (checked: profile-style t(1) 27.7 ms, a scheduler step's 28.3,
    a fresh single-sequence context 28.0, interleaved), so the quiet-machine minimum is what
    they cost. Small sizes are cheap and matter most, so they get more rounds."""
    from redwood.measure.profile import profile_latency

    large = [n for n in sizes if n > SMALL_SIZES]
    parts = []
    # profile_latency wants size 1 in every call (its baseline); the large call's t(1) is dropped.
    for chosen, rounds in (([n for n in sizes if n <= SMALL_SIZES], ROUNDS_SMALL),
                           ([1] + large if large else [], ROUNDS_LARGE)):
        if chosen:
            parts.append(profile_latency(target, draft, context=128, budgets=chosen,
                                         widths=chosen, repeats=rounds, warmup=1,
                                         progress=progress, statistic="min"))
    profile = parts[0]
    for part in parts[1:]:
        profile.target_ms.update({n: part.target_ms[n] for n in large})
        profile.draft_ms.update({n: part.draft_ms[n] for n in large})
        for side in ("target", "draft"):
            profile.extra["samples_ms"][side].update(
                {str(n): part.extra["samples_ms"][side][str(n)] for n in large})
    profile.extra["source"]["repeats"] = {"small": ROUNDS_SMALL, "large": ROUNDS_LARGE,
                                          "small_up_to": SMALL_SIZES}
    return profile


def acceptance_by_temperature(bundle=None):
    """params -> p: a tuned bundle's acceptance vector at the nearest temperature, else the
    shipped sample vector (acceptance only shapes the trees, never the output's law)."""
    if bundle is None:
        sample = tuple(Acceptance.load(sample_acceptance_path()).p)
        return lambda params: sample
    vectors = {e.temperature: tuple(Acceptance.load(bundle.directory / e.acceptance).p)
               for e in bundle.entries}
    return lambda params: vectors[bundle.entry(params.temperature).temperature]


def load_batch_scheduler(model=None, target=None, draft=None, tree=None, max_batch=None,
                         method: str = "sequoia", progress: bool = True,
                         n_threads: int | None = None, cache_dir=None, prefix_cache: bool = True,
                         cache_tokens: int | None = None, drafter: str = "model",
                         ngram_memory: int = 0):
    """(scheduler, tokenizer) for the shipped pair `model` or explicit GGUF paths.

    tree: None or a bundle dir / "auto" (the batch planner, with the bundle's acceptance
    vectors), or a tree JSON (that tree for every request). method "autoregressive": plain
    batched decoding, no draft loaded. max_batch None: from this machine's profile (16 lanes
    are made; without speculation all 16 are used; idle lanes hold cached prefixes).
    prefix_cache / cache_tokens: BatchScheduler's. drafter "ngram": draft by prompt lookup
    (serve/batch_ngram.py; the draft model is loaded only to find or take this machine's
    profile), with a memory of earlier answers of ngram_memory tokens (0 = none). drafter
    "auto": prompt lookup where the tuned bundle's acceptance vectors, planned on this
    machine's profile, give no draft-model tree that beats plain decoding at any of its
    temperatures (every 2-core CPU measured so far), else the draft model; without a bundle,
    the draft model."""
    from redwood.backends.llamacpp_multi import MultiSeqContext
    from redwood.decode.native_sampling import prepare as prepare_native
    from redwood.models.hf_loading import load_tokenizer
    from redwood.prompts import assistant_turn_ids

    if drafter not in ("model", "ngram", "auto"):
        raise RedwoodError(f"continuous batching drafts with the draft model or by prompt "
                           f"lookup (ngram, or auto: one of them for this machine), not "
                           f"{drafter!r}; use --max-batch 1 for it")
    target, draft, tokenizer_source, pair = _model_paths(model, target, draft, progress)
    fixed, bundle = _trees(tree, pair)                      # checked before minutes of loading
    tokenizer = load_tokenizer(tokenizer_source)
    lanes = max_batch or MAX_LANES
    leaves = max(1, min(MAX_BUDGET, 256 // lanes))
    n_ctx = lanes * CELLS_PER_LANE
    contexts = []
    try:
        contexts.append(MultiSeqContext.load(target, lanes, leaves, n_ctx, N_BATCH, n_threads))
        ngram, profile = None, None
        if method != "autoregressive" and drafter == "auto":
            profile = _machine_profile(contexts[0], draft, progress, cache_dir) \
                if bundle is not None else None
            drafter = "ngram" if profile is not None and model_declines(profile, bundle) \
                else "model"
        if method != "autoregressive" and drafter == "ngram":
            profile = profile or _machine_profile(contexts[0], draft, progress, cache_dir)
            ngram = _ngram_drafting(profile, bundle, ngram_memory, assistant_turn_ids(tokenizer))
            max_batch = max_batch or lanes
        elif method != "autoregressive":
            contexts.append(MultiSeqContext.load(draft, lanes, leaves, n_ctx, N_BATCH, n_threads))
        planner, max_batch = _planner(contexts, fixed, max_batch, progress, cache_dir)
        scheduler = BatchScheduler(contexts[0], contexts[1] if len(contexts) > 1 else None,
                                   planner, acceptance_by_temperature(bundle), max_batch,
                                   prefix_cache=prefix_cache, cache_tokens=cache_tokens,
                                   lone_prefill_chunk=N_BATCH, ngram=ngram)
        prepare_native()         # the plain sampler's C call built now, not in a request
        return scheduler, tokenizer
    except BaseException:
        for ctx in contexts:
            ctx.close()
        raise


def model_declines(profile: Profile, bundle) -> bool:
    """Whether no draft-model tree beats plain decoding on this machine at any of the bundle's
    temperatures (its acceptance vectors planned on `profile`, measure/hybrid_plans.py)."""
    from redwood.measure.hybrid_plans import hybrid_plans

    plans = hybrid_plans(profile, bundle, auto=True)
    return all(plans(e.temperature)[2] == "ngram" for e in bundle.entries)


def _machine_profile(target, draft_path, progress, cache_dir) -> Profile:
    """This machine's profile of the target, the one the single-request drafters use (cached
    per machine and pair: the draft model is loaded for its key and, on first use, its
    measurement)."""
    from redwood.backends.llamacpp import LlamaCppBackend
    from redwood.measure.machine_profile import machine_profile

    draft = LlamaCppBackend(draft_path, n_ctx=4096, n_threads=target.backend.n_threads)
    try:
        return machine_profile(target.backend, draft, cache_dir=cache_dir, progress=progress)
    finally:
        draft.close()
        target.backend.reset()


def _ngram_drafting(profile: Profile, bundle, memory_tokens: int, chat_turn: tuple[int, ...]):
    """The batch's prompt-lookup drafting: this machine's profile, the bundle's n-gram priors,
    a memory of earlier answers of memory_tokens (0 = none); chat_turn: the ids that open the
    assistant's turn in the model's chat template (chat requests learn in their own pool)."""
    from redwood.decode.ngram_memory import NgramMemory
    from redwood.measure.ngram_calibration import acceptance_model
    from redwood.serve.batch_ngram import BatchNgramDrafting

    memory = NgramMemory(max_tokens=memory_tokens) if memory_tokens > 0 else None
    return BatchNgramDrafting(profile, lambda: acceptance_model(bundle, learned=True,
                                                                chat_turn=chat_turn),
                              memory)


def _model_paths(model, target, draft, progress):
    """(target, draft, tokenizer source, shipped pair name or None)."""
    if target is None:
        from redwood.models.shipped import DEFAULT_PAIR, shipped_gguf_pair, shipped_tokenizer_dir

        pair = model or DEFAULT_PAIR
        target, draft = shipped_gguf_pair(pair, progress=progress)
        return target, draft, shipped_tokenizer_dir(pair, progress=progress), pair
    if draft is None:
        raise RedwoodError("give both --target and --draft GGUF files (or --model)")
    return target, draft, target, None


def _trees(tree, pair):
    """(fixed Tree or None, Bundle or None) for a --tree value."""
    from redwood.measure.bundles import find_bundle
    from redwood.plan.tree import Tree

    if tree is not None and Path(tree).is_file():
        return Tree.load(tree), None
    if tree is None and pair is None:
        return None, None
    return None, find_bundle(tree or "auto", pair, "llamacpp")


def _planner(contexts, fixed, max_batch, progress, cache_dir):
    """(planner, max_batch): the batch planner on this machine's profile, or a fixed tree."""
    from redwood.plan.batch_planner import ROOT_ONLY, BatchPlanner, FixedPlanner

    target = contexts[0]
    lanes = len(target.lanes)
    if len(contexts) == 1:
        return FixedPlanner(ROOT_ONLY, N_BATCH), max_batch or lanes
    if fixed is not None:
        return FixedPlanner(fixed, N_BATCH), max_batch or min(lanes, N_BATCH // len(fixed))
    sizes = batch_sizes(min(N_BATCH, lanes * MAX_BUDGET))
    profile = batch_profile(target, contexts[1], sizes, progress, cache_dir)
    planner = BatchPlanner(profile, MAX_BUDGET, MAX_DEPTH, target.lanes[0].width, N_BATCH)
    return planner, max_batch or choose_max_batch(profile, lanes)
