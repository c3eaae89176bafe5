"""How each benchmarked method generates one prompt, and what it measured.

Every runner has the same signature, `run(input_ids [L], setting, seed, max_new_tokens) ->
Measurement`, so the benchmark loop can interleave redwood's methods and the `transformers`
baselines on the same prompt.

Every runner also records the end-to-end wall time of the whole call, prefill included
(Measurement.end_to_end_seconds; the primary figure of docs/design.md §9, and the primary column
of the llama.cpp bench). The decode-only figures (tokens/s) exclude prefill:
- redwood methods report their prefill separately (GenerationResult.prefill_seconds); a
  speculative request on the transformers backend fuses the target's prompt pass into its
  first verification (docs/design.md §5.4), so its prefill_seconds is the draft's alone and
  the target's prompt pass counts as decode: its decode-only rate is understated, which is one
  more reason end to end is the primary figure;
- `transformers` `generate` cannot split it out, so it is estimated by timing a 1-token
  `generate` of the target on the same prompt right before the run (and, for assisted
  generation, a 1-token `generate` of the draft alone: its prefill happens inside the
  first assisted step). The estimate is subtracted from the run's wall time, and the first
  token (made by that prefill) is not counted: tokens/s = (M - 1) / (wall - estimate);
- llama-cpp-python's `Llama` (bench.llamacpp_runners) times its prompt evaluation directly
  and, like transformers, makes the first token from it: tokens/s = (M - 1) / (wall - prefill).
Forward counts and time in each model come from forward hooks on the two models. EOS is
ignored by every method (see hf_generation_config).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Setting:
    """One sampling setting of the benchmark grid."""
    temperature: float
    top_p: float

    @property
    def label(self) -> str:
        return f"T={self.temperature:g} top_p={self.top_p:g}"


@dataclass
class Measurement:
    """One method on one prompt at one setting."""
    tokens: list[int]                # every new token generated (M of them)
    timed_tokens: int                # tokens produced inside decode_seconds
    decode_seconds: float            # prefill excluded (measured or estimated, see module doc)
    prefill_seconds: float
    prefill_estimated: bool          # True for transformers runs (1-token generate timing)
    target_forwards: int             # target forwards that produced the M tokens
    draft_forwards: int
    target_seconds: float            # time in target forwards during decoding
    draft_seconds: float
    other_seconds: float             # decode time outside both models' forwards
    acceptance_by_depth: list[float] = field(default_factory=list)
    end_to_end_seconds: float | None = None   # wall time of the whole call, prefill included
    draft_source: str | None = None  # who proposed the drafts: "model", "ngram" (None: plain)
    governor_plain_steps: int | None = None   # steps the governor ran plain (None: ungoverned)
    kept_by_source: dict | None = None  # drafted tokens accepted per source (drafters that tag)

    @property
    def draft_tokens_kept(self) -> int:
        """Tokens beyond one per target forward: the drafted tokens the target accepted (each
        forward makes one token of its own, the bonus or a plain step's token)."""
        return max(len(self.tokens) - self.target_forwards, 0) if self.draft_source else 0

    @property
    def tokens_per_second(self) -> float:
        return self.timed_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens gained per target forward (all M tokens over the forwards that made them)."""
        return len(self.tokens) / self.target_forwards if self.target_forwards else 0.0

    def as_dict(self) -> dict:
        return {"new_tokens": len(self.tokens), "timed_tokens": self.timed_tokens,
                "decode_seconds": self.decode_seconds, "prefill_seconds": self.prefill_seconds,
                "prefill_estimated": self.prefill_estimated,
                "target_forwards": self.target_forwards, "draft_forwards": self.draft_forwards,
                "target_seconds": self.target_seconds, "draft_seconds": self.draft_seconds,
                "other_seconds": self.other_seconds,
                "tokens_per_second": self.tokens_per_second,
                "tokens_per_step": self.tokens_per_step,
                "end_to_end_seconds": self.end_to_end_seconds,
                "acceptance_by_depth": self.acceptance_by_depth,
                "draft_source": self.draft_source, "draft_tokens_kept": self.draft_tokens_kept,
                "governor_plain_steps": self.governor_plain_steps,
                "kept_by_source": self.kept_by_source}


# --- redwood's own methods ----------------------------------------------------------------

def redwood_runner(engine, method: str, draft_confidence: float = 0.0, source: str = "model"):
    """Runner for Engine.generate with `method` on the engine's tree (EOS ignored).

    Plain decoding (autoregressive, or a tree of one node) takes its first token from the
    prefill's last row, so M - 1 tokens are made inside decode_seconds; speculative methods
    prefill all but the last prompt token and make all M inside it. `source` names who
    drafts ("model", "ngram" or "hybrid": then each accepted token is credited to the source
    that proposed it; plain decoding has none). A governed engine (one with a
    machine profile) also reports how many steps its governor ran plain."""
    plain = method == "autoregressive" or len(engine.tree) == 1
    governed = not plain and getattr(engine, "profile", None) is not None

    def run(input_ids, setting: Setting, seed: int, max_new_tokens: int) -> Measurement:
        start = time.perf_counter()
        result = engine.generate(input_ids, max_new_tokens, temperature=setting.temperature,
                                 top_p=setting.top_p, top_k=0, seed=seed, method=method,
                                 stop_on_eos=False, draft_confidence=draft_confidence,
                                 cache_prompt=False)      # every method prefills its prompt
        wall = time.perf_counter() - start
        stats = result.stats
        return Measurement(
            tokens=list(result.tokens),
            timed_tokens=max(len(result.tokens) - 1, 0) if plain else len(result.tokens),
            decode_seconds=result.decode_seconds, prefill_seconds=result.prefill_seconds,
            prefill_estimated=False, target_forwards=stats.target_forwards,
            draft_forwards=stats.draft_forwards, target_seconds=stats.target_seconds,
            draft_seconds=stats.draft_seconds, other_seconds=stats.other_seconds,
            acceptance_by_depth=stats.acceptance_by_depth(), end_to_end_seconds=wall,
            draft_source=None if plain else source,
            governor_plain_steps=stats.plain_steps if governed else None,
            kept_by_source=dict(stats.accepted_by_source) if stats.accepted_by_source else None)
    return run


# --- transformers baselines ------------------------------------------------------------------

class ForwardTimer:
    """Counts a module's forward calls and the seconds spent in them (hooks; CUDA-synced)."""

    def __init__(self, module):
        self.module = module
        self.calls = 0
        self.seconds = 0.0
        self.durations: list[float] = []    # seconds of each call, in order
        self._start = None
        self._handles = []

    def _sync(self):
        if self.module is not None and next(self.module.parameters()).is_cuda:
            torch.cuda.synchronize()

    def __enter__(self):
        if self.module is None:
            return self

        def before(module, args, kwargs=None):
            self._sync()
            self._start = time.perf_counter()

        def after(module, args, output):
            self._sync()
            seconds = time.perf_counter() - self._start
            self.calls += 1
            self.seconds += seconds
            self.durations.append(seconds)

        self._handles = [self.module.register_forward_pre_hook(before),
                         self.module.register_forward_hook(after)]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []


def hf_generation_config(model, setting: Setting, max_new_tokens: int):
    """A clean GenerationConfig: exactly the benchmark's sampling, nothing from the model's
    defaults (no top-k, no repetition penalty), and EOS ignored the way redwood's
    stop_on_eos=False ignores it: no EOS ids at all (an empty list, which the model's
    defaults do not override), so generation neither stops at EOS nor suppresses it.
    (`min_new_tokens` would suppress EOS, changing the target's distribution: greedy outputs
    would then differ from every redwood method after the first EOS.)"""
    from transformers import GenerationConfig

    eos = model.generation_config.eos_token_id if model.generation_config else None
    if eos is None:
        eos = model.config.eos_token_id
    pad = eos[0] if isinstance(eos, (list, tuple)) else eos
    sampled = setting.temperature > 0
    options = dict(max_new_tokens=max_new_tokens, do_sample=sampled, num_beams=1,
                   repetition_penalty=1.0, top_k=0, eos_token_id=[],
                   pad_token_id=pad if pad is not None else 0)
    if sampled:
        options.update(temperature=setting.temperature, top_p=setting.top_p)
    return GenerationConfig(**options)


@dataclass
class AssistantSchedule:
    """How transformers assisted generation drafts: its default, or a constant length k."""
    num_assistant_tokens: int | None = None     # None: transformers' default schedule

    @property
    def label(self) -> str:
        return "default" if self.num_assistant_tokens is None else f"k={self.num_assistant_tokens}"

    def apply(self, draft, original_config) -> None:
        """Reset the assistant's generation config (transformers adapts it across calls),
        then pin the schedule."""
        draft.generation_config = copy.deepcopy(original_config)
        if self.num_assistant_tokens is not None:
            draft.generation_config.num_assistant_tokens = self.num_assistant_tokens
            draft.generation_config.num_assistant_tokens_schedule = "constant"
            draft.generation_config.assistant_confidence_threshold = 0.0   # no early stop


def _timed_generate(model, ids, config, assistant=None):
    """(wall seconds, output ids, target timer, draft timer) of one transformers generate."""
    mask = torch.ones_like(ids)
    extra = {"assistant_model": assistant} if assistant is not None else {}
    with ForwardTimer(model) as target_timer, ForwardTimer(assistant) as draft_timer:
        start = _now(model)
        output = model.generate(ids, attention_mask=mask, generation_config=config, **extra)
        wall = _now(model) - start
    return wall, output, target_timer, draft_timer


def _now(model) -> float:
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter()


def _prefill_estimate(model, ids, setting):
    """A 1-token generate: (wall seconds, seconds inside the model's forward)."""
    wall, _, timer, _ = _timed_generate(model, ids, hf_generation_config(model, setting, 1))
    return wall, timer.seconds


def hf_runner(target, draft=None, schedule: AssistantSchedule | None = None):
    """Runner for transformers `generate` with the target alone, or assisted by `draft`."""
    original_config = copy.deepcopy(draft.generation_config) if draft is not None else None

    @torch.inference_mode()
    def run(input_ids, setting: Setting, seed: int, max_new_tokens: int) -> Measurement:
        ids = torch.as_tensor(input_ids).reshape(1, -1).to(target.device)
        prefill_wall, prefill_target = _prefill_estimate(target, ids, setting)
        prefill_draft = draft_wall = 0.0
        if draft is not None:
            draft_wall, prefill_draft = _prefill_estimate(draft, ids, setting)
            (schedule or AssistantSchedule()).apply(draft, original_config)
        config = hf_generation_config(target, setting, max_new_tokens)
        torch.manual_seed(seed)
        wall, output, target_timer, draft_timer = _timed_generate(target, ids, config, draft)
        if draft is not None:
            draft.generation_config = copy.deepcopy(original_config)
        tokens = output[0, ids.shape[1]:].tolist()
        decode = max(wall - prefill_wall - draft_wall, 1e-9)
        target_s = max(target_timer.seconds - prefill_target, 0.0)
        draft_s = max(draft_timer.seconds - prefill_draft, 0.0)
        return Measurement(
            tokens=tokens, timed_tokens=max(len(tokens) - 1, 0), decode_seconds=decode,
            prefill_seconds=prefill_wall + draft_wall, prefill_estimated=True,
            target_forwards=target_timer.calls, draft_forwards=draft_timer.calls,
            target_seconds=target_s, draft_seconds=draft_s,
            other_seconds=max(decode - target_s - draft_s, 0.0), end_to_end_seconds=wall,
            draft_source="model" if draft is not None else None)
    return run
