"""`redwood demo`: one HumanEval prompt, redwood (the tuned bundle for this runtime) beside the
plain baseline on the same runtime, greedy, with the planner's reasoning in a line or two.

On llama.cpp (the default for the shipped pair on a CPU) the baseline is llama-cpp-python's own
high-level `Llama` decoding the same GGUF: what llama.cpp users run. On transformers it is the
target alone through redwood's engine.
"""
from __future__ import annotations

import sys
import time
from dataclasses import replace

from redwood.cli.textgen import ModelConfig, load_engine, stats_lines, stream_text
from redwood.decode.params import SamplingParams
from redwood.errors import RedwoodError
from redwood.prompts import encode_prompt, humaneval_prompts


def run_demo(config: ModelConfig, max_new_tokens: int = 96, problem: int = 0) -> int:
    prompts = humaneval_prompts("evaluation")
    if not 0 <= problem < len(prompts):
        raise RedwoodError(f"--problem must be in 0..{len(prompts) - 1}")
    from redwood.models.runtime import choose_backend

    backend = choose_backend(config.backend, config.target, config.draft, config.device)
    config = replace(config, backend=backend)
    print(f"loading the model pair on the {backend} backend (the first run assembles or "
          "builds a cache: a few minutes) ...", file=sys.stderr)
    engine, tokenizer = load_engine(config)
    prompt = prompts[problem]
    print(planner_line(engine, config), file=sys.stderr)
    print("\n=== prompt (HumanEval evaluation split) ===")
    print(prompt)
    greedy = SamplingParams(max_new_tokens=max_new_tokens)
    print("=== redwood ===")
    # EOS ignored: every method generates the same number of tokens, a fair speed comparison
    start = time.perf_counter()
    result, _ = stream_text(engine, tokenizer, prompt, greedy, stop_on_eos=False,
                            on_text=lambda piece: print(piece, end="", flush=True))
    redwood_seconds = time.perf_counter() - start
    print()
    for line in stats_lines(result):
        print(f"  {line}")
    if backend == "llamacpp":
        ids = encode_prompt(tokenizer, prompt).tolist()
        baseline, baseline_seconds = plain_llamacpp(engine.target_backend, ids, max_new_tokens)
        label = "plain llama.cpp (llama-cpp-python Llama, same GGUF and threads)"
    else:
        base, _ = stream_text(engine, tokenizer, prompt, greedy, method="autoregressive",
                              stop_on_eos=False)
        baseline, baseline_seconds = base.tokens, base.prefill_seconds + base.decode_seconds
        redwood_seconds = result.prefill_seconds + result.decode_seconds
        label = "target alone (autoregressive, same engine)"
    same = baseline == result.tokens
    print(f"\n{label}: {len(baseline) / baseline_seconds:.1f} tokens/s; redwood: "
          f"{len(result.tokens) / redwood_seconds:.1f} tokens/s "
          f"({baseline_seconds / redwood_seconds:.2f}x, whole request incl. prefill); "
          f"identical output: {'yes' if same else 'NO'}")
    if not same and backend == "llamacpp":
        first = next(i for i, (a, b) in enumerate(zip(baseline + [-1], result.tokens)) if a != b)
        print(f"  (the outputs part at new token {first}: llama.cpp's kernels differ by batch size, "
              "so a near-tie can resolve either way; docs/design.md §5)")
        return 0
    return 0 if same else 1


def planner_line(engine, config) -> str:
    """One or two lines on what the planner chose and why."""
    tree, source = engine.tree, engine.tree.source
    origin = ("tuned bundle, planned for this machine" if "bundle" in source
              else (config.tree or "default tree"))
    if len(tree) == 1:
        rejected = source.get("best_rejected")
        why = (f"; the best tree it considered (n = {rejected['budget']}, d = {rejected['depth']}) "
               f"predicts {rejected['predicted_speedup']:.2f}x" if rejected else "")
        return (f"planner ({origin}): no speculation pays on these measured costs (target "
                f"{source.get('step_ms', float('nan')):.1f} ms per token){why}; redwood decodes "
                "with the target alone")
    pruning = (f", pruned below draft tokens of probability < {engine.draft_confidence:.2f}"
               if engine.draft_confidence else "")
    predicted = source.get("predicted_speedup")
    return (f"planner ({origin}): tree of up to {len(tree)} nodes, {tree.num_levels} levels"
            f"{pruning}" + (f"; predicted {predicted:.2f}x" if predicted else ""))


def plain_llamacpp(target_backend, ids: list[int], max_new_tokens: int) -> tuple[list[int], float]:
    """Greedy decoding of exactly `max_new_tokens` tokens with llama-cpp-python's high-level
    `Llama` on the target's GGUF: (tokens, seconds for the whole request, prefill included)."""
    from llama_cpp import Llama

    llm = Llama(model_path=target_backend.name, n_ctx=target_backend.n_ctx,
                n_threads=target_backend.n_threads, n_threads_batch=target_backend.n_threads,
                n_batch=512, verbose=False)
    tokens: list[int] = []
    start = time.perf_counter()
    for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, reset=True):
        tokens.append(int(token))
        if len(tokens) == max_new_tokens:            # EOS ignored, as for redwood above
            break
    seconds = time.perf_counter() - start
    llm.close()
    return tokens, seconds
