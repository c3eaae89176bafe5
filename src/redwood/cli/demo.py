"""`redwood demo`: one HumanEval prompt, sequoia vs the target alone, greedy."""
from __future__ import annotations

import sys
from dataclasses import replace

from redwood.cli.textgen import ModelConfig, load_engine, stats_lines, stream_text
from redwood.decode.params import SamplingParams
from redwood.errors import RedwoodError
from redwood.prompts import humaneval_prompts


def run_demo(config: ModelConfig, max_new_tokens: int = 96, problem: int = 0) -> int:
    prompts = humaneval_prompts("evaluation")
    if not 0 <= problem < len(prompts):
        raise RedwoodError(f"--problem must be in 0..{len(prompts) - 1}")
    from redwood.measure.bundles import is_bundle_dir, shipped_bundle_dir
    from redwood.models.shipped import DEFAULT_PAIR

    if config.tree is None and config.target is None \
            and is_bundle_dir(shipped_bundle_dir(config.model or DEFAULT_PAIR)):
        config = replace(config, tree="auto")      # the bundle tuned on a 2-core CPU
    print("loading the model pair (the first run builds a cache: a few minutes) ...", file=sys.stderr)
    engine, tokenizer = load_engine(config)
    prompt = prompts[problem]
    source = "tuned bundle" if config.tree == "auto" else (config.tree or "default tree")
    pruning = (f", pruned below draft tokens of probability < {engine.draft_confidence:.2f}"
               if engine.draft_confidence else "")
    print(f"tree ({source}): up to {len(engine.tree)} nodes, {engine.tree.num_levels} levels"
          f"{pruning}\n", file=sys.stderr)
    print("=== prompt (HumanEval evaluation split) ===")
    print(prompt)
    results = {}
    greedy = SamplingParams(max_new_tokens=max_new_tokens)
    for method in ("sequoia", "autoregressive"):
        print(f"=== {method} ===")
        # EOS ignored: both methods generate the same number of tokens, a fair speed comparison
        result, text = stream_text(engine, tokenizer, prompt, greedy, method=method,
                                   stop_on_eos=False,
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
