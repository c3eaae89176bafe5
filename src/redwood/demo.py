"""`redwood demo`: one HumanEval prompt, sequoia vs the target alone, greedy."""
from __future__ import annotations

import sys

from redwood.errors import RedwoodError
from redwood.prompts import humaneval_prompts
from redwood.textgen import ModelConfig, SamplingConfig, load_engine, stats_lines, stream_text


def run_demo(config: ModelConfig, max_new_tokens: int = 96, problem: int = 0) -> int:
    prompts = humaneval_prompts("evaluation")
    if not 0 <= problem < len(prompts):
        raise RedwoodError(f"--problem must be in 0..{len(prompts) - 1}")
    print("loading the model pair (the first run builds a cache: a few minutes) ...", file=sys.stderr)
    engine, tokenizer = load_engine(config)
    prompt = prompts[problem]
    print(f"tree: {len(engine.tree)} nodes, {engine.tree.num_levels} levels\n", file=sys.stderr)
    print("=== prompt (HumanEval evaluation split) ===")
    print(prompt)
    results = {}
    for method in ("sequoia", "autoregressive"):
        print(f"=== {method} ===")
        sampling = SamplingConfig(method=method, max_new_tokens=max_new_tokens, stop_on_eos=False)
        result, text = stream_text(engine, tokenizer, prompt, sampling,
                                   on_text=lambda piece: print(piece, end="", flush=True))
        print()
        for line in stats_lines(result):
            print(f"  {line}")
        results[method] = result
    same = results["sequoia"].tokens == results["autoregressive"].tokens
    speedup = results["sequoia"].tokens_per_second / results["autoregressive"].tokens_per_second
    print(f"\nidentical output: {'yes' if same else 'NO'}; "
          f"sequoia speedup over autoregressive: {speedup:.2f}x (decode time, prefill excluded)")
    return 0 if same else 1
