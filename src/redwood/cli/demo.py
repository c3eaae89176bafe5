"""`redwood demo`: redwood beside the plain baseline on the same runtime, greedy, with the
planner's reasoning in a line or two. By default an edit task (a pasted module to change and
return), where prompt-lookup drafts sized for this machine pay; `--task humaneval` completes a
HumanEval prompt with the tuned bundle instead.

On llama.cpp (the default for the shipped pair on a CPU) the baseline is llama.cpp's own
`llama-server` on the same GGUF with the same threads and context, asked over loopback HTTP, when
`make llama-server` has built it (or $REDWOOD_LLAMA_SERVER names one); else llama-cpp-python's
high-level `Llama` decoding the same GGUF. The report line says which. On transformers it is the
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


def run_demo(config: ModelConfig, max_new_tokens: int = 128, problem: int = 0,
             task: str = "edit") -> int:
    """task "edit": a pasted module to edit and return (input-grounded: prompt-lookup drafts pay);
    "humaneval": a completion prompt with the tuned bundle's drafting."""
    from redwood.models.runtime import choose_backend

    if task not in ("edit", "humaneval"):
        raise RedwoodError(f"--task must be edit or humaneval, got {task!r}")
    backend = choose_backend(config.backend, config.target, config.draft, config.device)
    edit_default = task == "edit" and config.drafter in (None, "model")  # free drafts pay on edits
    config = replace(config, backend=backend, drafter="ngram" if edit_default else config.drafter)
    prompt, chat, title = _demo_prompt(task, problem)
    print(f"loading the model pair on the {backend} backend (the first run assembles or "
          "builds a cache and measures this machine: a few minutes) ...", file=sys.stderr)
    engine, tokenizer = load_engine(config)
    print(planner_line(engine, config), file=sys.stderr)
    print(f"\n=== prompt ({title}) ===\n{prompt}\n=== redwood ===")
    greedy = SamplingParams(max_new_tokens=max_new_tokens)
    # EOS ignored: every method generates the same number of tokens, a fair speed comparison
    start = time.perf_counter()
    result, _ = stream_text(engine, tokenizer, prompt, greedy, chat=chat, stop_on_eos=False,
                            on_text=lambda piece: print(piece, end="", flush=True))
    redwood_seconds = time.perf_counter() - start
    print()
    for line in stats_lines(result):
        print(f"  {line}")
    if backend == "llamacpp":
        from redwood.bench.server_run import find_llama_server

        ids = encode_prompt(tokenizer, prompt, chat).tolist()
        binary = find_llama_server(None)
        if binary is not None:
            text, count, baseline_seconds = plain_llama_server(binary, engine.target_backend,
                                                               ids, max_new_tokens)
            same = text == tokenizer.decode(result.tokens)
            return _report(count, baseline_seconds, same, result.tokens, redwood_seconds,
                           "plain llama-server (llama.cpp's own server, same sources, GGUF, "
                           "threads and context; over loopback HTTP)", backend)
        baseline, baseline_seconds = plain_llamacpp(engine.target_backend, ids, max_new_tokens)
        label = ("plain llama.cpp (llama-cpp-python Llama, same GGUF and threads; "
                 "`make llama-server` to compare with llama-server)")
    else:
        base, _ = stream_text(engine, tokenizer, prompt, greedy, chat=chat,
                              method="autoregressive", stop_on_eos=False)
        baseline, baseline_seconds = base.tokens, base.prefill_seconds + base.decode_seconds
        redwood_seconds = result.prefill_seconds + result.decode_seconds
        label = "target alone (autoregressive, same engine)"
    return _report(len(baseline), baseline_seconds, baseline == result.tokens, result.tokens,
                   redwood_seconds, label, backend, baseline)


def _demo_prompt(task: str, problem: int) -> tuple[str, bool, str]:
    """(prompt, chat, title) of the demo task."""
    if task == "edit":
        from redwood.edit_tasks import edit_tasks

        if not 0 <= problem < 30:
            raise RedwoodError("--problem must be in 0..29 for --task edit")
        chosen = edit_tasks("whole_file", problem + 1)[problem]
        return chosen.prompt, True, f"edit task {chosen.name}: rename a function, return the module"
    prompts = humaneval_prompts("evaluation")
    if not 0 <= problem < len(prompts):
        raise RedwoodError(f"--problem must be in 0..{len(prompts) - 1}")
    return prompts[problem], False, "HumanEval evaluation split"


def _report(baseline_count, baseline_seconds, same, tokens, redwood_seconds, label, backend,
            baseline_tokens=None) -> int:
    print(f"\n{label}: {baseline_count / baseline_seconds:.1f} tokens/s; redwood: "
          f"{len(tokens) / redwood_seconds:.1f} tokens/s "
          f"({baseline_seconds / redwood_seconds:.2f}x, whole request incl. prefill); "
          f"identical output: {'yes' if same else 'NO'}")
    if not same and backend == "llamacpp":
        where = ""
        if baseline_tokens is not None:
            first = next(i for i, (a, b) in enumerate(zip(baseline_tokens + [-1], tokens)) if a != b)
            where = f" at new token {first}"
        print(f"  (the outputs part{where}: llama.cpp's kernels differ by batch size, "
              "so a near-tie can resolve either way; docs/design.md §5)")
        return 0
    return 0 if same else 1


def planner_line(engine, config) -> str:
    """One or two lines on what the planner chose and why."""
    from redwood.decode.hybrid_drafter import HybridDrafter
    from redwood.decode.ngram_drafter import NgramDrafter

    tree, source = engine.tree, engine.tree.source
    t = engine.profile.target_ms if engine.profile is not None else {}
    costs = ", ".join(f"t({n}) = {t[n]:.0f} ms" for n in (1, 2, 4, 8) if n in t)
    if isinstance(engine.drafter, NgramDrafter):
        return ("planner: prompt-lookup drafts cost nothing to make, but verifying them does "
                f"({costs} on this machine): each step keeps the n-gram tree that maximises "
                "expected tokens / t(n), plain steps where matches are weak")
    hybrid = isinstance(engine.drafter, HybridDrafter)
    if hybrid and engine.drafter.plans(0.0)[2:] == ("ngram",):
        return ("planner (--drafter auto): no draft-model tree beats plain decoding on this "
                f"machine ({costs}), so drafts come from prompt lookup alone: each step keeps "
                "the n-gram tree that maximises expected tokens / t(n), plain steps where "
                "matches are weak")
    if hybrid:
        return ("planner: each step weighs the free n-gram tree (expected tokens / t(n)) against "
                "the draft model's tree planned for this machine (its live tokens per ms), "
                "grafting n-gram continuations onto the model's tree when the model runs")
    origin = ("tuned bundle, planned for this machine" if "bundle" in source
              else (config.tree or "default tree"))
    if len(tree) == 1:
        rejected = source.get("best_rejected")
        why = (f"; the best tree it considered (n = {rejected['budget']}, d = {rejected['depth']}) "
               f"predicts {rejected['predicted_speedup']:.2f}x" if rejected else "")
        return (f"planner ({origin}): no draft-model tree pays on these measured costs (target "
                f"{source.get('step_ms', float('nan')):.1f} ms per token){why}; redwood decodes "
                "with the target alone")
    pruning = (f", pruned below draft tokens of probability < {engine.draft_confidence:.2f}"
               if engine.draft_confidence else "")
    predicted = source.get("predicted_speedup")
    return (f"planner ({origin}): tree of up to {len(tree)} nodes, {tree.num_levels} levels"
            f"{pruning}" + (f"; predicted {predicted:.2f}x" if predicted else ""))


def plain_llama_server(binary: str, target_backend, ids: list[int],
                       max_new_tokens: int) -> tuple[str, int, float]:
    """Greedy decoding of exactly `max_new_tokens` tokens (ignore_eos) by llama-server on the
    target's GGUF with the backend's threads and context: (text, tokens, seconds for the whole
    request as the client saw it, prefill included). One untimed warm-up request first."""
    from redwood.bench.http_client import complete
    from redwood.bench.server_bench import request_body
    from redwood.bench.server_process import ServerProcess, free_port
    from redwood.bench.server_specs import METHODS, ServerSetup, command
    from redwood.cache_dirs import cache_root

    setup = ServerSetup(target_backend.name, "", target_backend.n_threads, target_backend.n_ctx,
                        binary)
    port = free_port()
    server = ServerProcess("llama-server", command(METHODS["llama-server"], setup, port), port,
                           cache_root() / "logs" / "demo-llama-server.log", startup_timeout=300)
    print("starting llama-server for the baseline ...", file=sys.stderr)
    with server.start():
        complete(server.url, request_body(ids[:8], 0.0, 0, 2, False))
        body = dict(request_body(ids, 0.0, 0, max_new_tokens, False), ignore_eos=True)
        reply = complete(server.url, body)
    return reply.text, int(reply.completion_tokens or 0), reply.wall_seconds


def plain_llamacpp(target_backend, ids: list[int], max_new_tokens: int) -> tuple[list[int], float]:
    """Greedy decoding of exactly `max_new_tokens` tokens with llama-cpp-python's high-level
    `Llama` on the target's GGUF, configured as the benchmark's baseline (same threads, n_ctx
    and attention kernel): (tokens, seconds for the whole request, prefill included)."""
    from redwood.bench.llamacpp_runners import HighLevelLlama, llama_runner
    from redwood.bench.runners import Setting

    model = HighLevelLlama(target_backend.name, target_backend.n_ctx, target_backend.n_threads)
    try:
        measured = llama_runner(model)(ids, Setting(0.0, 1.0), 0, max_new_tokens)
    finally:
        model.close()
    return measured.tokens, measured.end_to_end_seconds
