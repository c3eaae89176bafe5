"""The llama.cpp baselines of `redwood bench --backend llamacpp`: llama-cpp-python's high-level
`Llama` on the target GGUF, alone (`llamacpp_plain`) and with its own prompt-lookup speculative
decoding (`llamacpp_prompt_lookup`: `LlamaPromptLookupDecoding(num_pred_tokens=10)`, its
default). Same runner signature and Measurement as bench.runners.

- What users run: `Llama(model_path=<the target GGUF>, n_ctx, n_threads = n_threads_batch =
  the cores redwood's backend uses, verbose=False)`, one per method, loaded once per bench run.
  One setting differs from Llama's defaults: `flash_attn=True`. redwood's backend creates its
  context with llama.cpp's default `flash_attn_type = auto`, which resolves to enabled on the
  CPU, and docs/design.md §9 asks for the same kernels on every side (Llama's own default,
  False, would run a different attention kernel).
- Exactly max_new_tokens tokens, EOS ignored: tokens come from `Llama.generate(tokens,
  temp=T, top_p=P, top_k=0, min_p=0, typical_p=1, repeat_penalty=1)`, an endless generator
  (EOS is checked by create_completion, not by generate), stopped after N tokens. EOS is
  neither stopped at nor suppressed (no logit bias), like redwood's stop_on_eos=False, so
  greedy outputs stay comparable token for token.
- `Llama.reset()` before each run: generate would otherwise reuse the longest prefix cached by
  the previous run (the same prompt at another setting) and skip most of the prefill.
- Timing: the end-to-end time is the whole call, generate until the N-th token. `Llama.eval`
  is wrapped to time each evaluation: the first is the prompt (the prefill, which also yields
  the first token); the rest are the target forwards of decoding. The prompt-lookup proposer
  is wrapped to time its proposals (draft). Sampling and Python are "other".
- Sampling: llama.cpp's sampler chain as generate builds it (top-k off, typical off, top-p,
  min-p off, temperature, seeded draw with seed = Llama.set_seed(seed)). top-p acts on the
  untempered distribution, before temperature, where redwood applies temperature first: the
  distributions agree when top_p = 1 or T = 1. Greedy (T = 0) is argmax.
- With a draft model `Llama` keeps the logits of every evaluated token (it forces logits_all),
  so its prefill also computes the output head for every prompt token: that is what users of
  its prompt lookup pay, and it is inside its end-to-end time. The prompt-lookup `Llama` is
  created with logits_all=True as well: 0.3.36 sizes its logits array by the argument, not by
  the forced setting, so without it any request past n_batch (512) tokens fails with a
  broadcast error.
"""
from __future__ import annotations

import time

from redwood.bench.runners import Measurement, Setting
from redwood.errors import RedwoodError

LOOKUP_TOKENS = 10               # LlamaPromptLookupDecoding's default num_pred_tokens
FLASH_ATTN = True                # what llama.cpp's "auto" resolves to on the CPU (see above)


class HighLevelLlama:
    """One llama-cpp-python `Llama` on a GGUF, its evaluations (and proposals) timed."""

    def __init__(self, path, n_ctx: int, n_threads: int, prompt_lookup: int | None = None):
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        except ImportError:
            raise RedwoodError("the llama.cpp baselines need llama-cpp-python "
                               "(pip install llama-cpp-python==0.3.36)") from None
        self.prompt_lookup = prompt_lookup
        self.draft = _TimedProposer(LlamaPromptLookupDecoding(num_pred_tokens=prompt_lookup)) \
            if prompt_lookup else None
        try:
            self.llm = Llama(model_path=str(path), n_ctx=int(n_ctx), n_threads=int(n_threads),
                             n_threads_batch=int(n_threads), flash_attn=FLASH_ATTN,
                             draft_model=self.draft, logits_all=self.draft is not None,
                             verbose=False)
        except (ValueError, RuntimeError) as err:
            raise RedwoodError(f"llama-cpp-python's Llama could not load {path}: {err}") from None
        self.path, self.n_ctx, self.n_threads = str(path), int(n_ctx), int(n_threads)
        self.evals: list[float] = []           # seconds of each Llama.eval of the current run
        original = self.llm.eval

        def timed_eval(tokens):
            start = time.perf_counter()
            try:
                original(tokens)
            finally:
                self.evals.append(time.perf_counter() - start)

        self.llm.eval = timed_eval              # generate calls self.eval: the instance's wins

    def describe(self) -> str:
        lookup = (f", draft_model=LlamaPromptLookupDecoding(num_pred_tokens={self.prompt_lookup})"
                  if self.prompt_lookup else "")
        return (f"Llama(n_ctx={self.n_ctx}, n_threads=n_threads_batch={self.n_threads}, "
                f"flash_attn={FLASH_ATTN}{lookup})")

    def close(self) -> None:
        self.llm.close()


class _TimedProposer:
    """A `LlamaDraftModel` (duck-typed: Llama only calls it) that times another one."""

    def __init__(self, inner):
        self.inner = inner
        self.calls, self.seconds = 0, 0.0

    def __call__(self, input_ids, /, **kwargs):
        start = time.perf_counter()
        try:
            return self.inner(input_ids, **kwargs)
        finally:
            self.calls += 1
            self.seconds += time.perf_counter() - start


def llama_runner(model: HighLevelLlama, num_pred_tokens: int | None = None):
    """Runner for `Llama.generate` on `model` (see the module doc). With prompt lookup,
    `num_pred_tokens` (default: the model's) is set on its LlamaPromptLookupDecoding before
    each run, so one `Llama` serves every grid entry."""
    if num_pred_tokens is not None and model.draft is None:
        raise RedwoodError("num_pred_tokens applies to a prompt-lookup Llama")

    def run(input_ids, setting: Setting, seed: int, max_new_tokens: int) -> Measurement:
        llm, draft = model.llm, model.draft
        if draft is not None:
            draft.inner.num_pred_tokens = int(num_pred_tokens or model.prompt_lookup)
        ids = [int(t) for t in input_ids]
        llm.reset()                      # no prefix reuse: every run evaluates its whole prompt
        llm.set_seed(int(seed))
        model.evals.clear()
        if draft is not None:
            draft.calls, draft.seconds = 0, 0.0
        tokens: list[int] = []
        start = time.perf_counter()
        stream = llm.generate(ids, temp=setting.temperature, top_p=setting.top_p, top_k=0,
                              min_p=0.0, typical_p=1.0, repeat_penalty=1.0)
        try:
            for token in stream:
                tokens.append(int(token))
                if len(tokens) >= max_new_tokens:
                    break
        finally:
            stream.close()
        wall = time.perf_counter() - start
        evals = list(model.evals)
        prefill = evals[0] if evals else 0.0
        decode = max(wall - prefill, 1e-9)
        target = sum(evals[1:])
        drafted = draft.seconds if draft is not None else 0.0
        return Measurement(
            tokens=tokens, timed_tokens=max(len(tokens) - 1, 0), decode_seconds=decode,
            prefill_seconds=prefill, prefill_estimated=False, target_forwards=len(evals),
            draft_forwards=draft.calls if draft is not None else 0, target_seconds=target,
            draft_seconds=drafted, other_seconds=max(decode - target - drafted, 0.0),
            end_to_end_seconds=wall, draft_source="ngram" if draft is not None else None)
    return run


def runtime_description(n_threads: int) -> str:
    """'llama.cpp via llama-cpp-python 0.3.36, AVX2 build, 2 threads' for table headers."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    flags = {part.split("=")[0].strip() for part in info.replace("|", "\n").splitlines()
             if part.strip().endswith("= 1")}
    simd = next((f for f in ("AVX512", "AVX2", "AVX", "NEON", "SSE3") if f in flags), "generic")
    return (f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, {simd} build, "
            f"{n_threads} threads")


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo; the platform's processor string elsewhere)."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
