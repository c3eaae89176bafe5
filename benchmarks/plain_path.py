"""Where a plain decoding step's time goes on the llama.cpp backend: inside `llama_decode`, and
everything redwood does around it (the logits row copy, sampling, the engine's Python).

    python benchmarks/plain_path.py                       # shipped pair, 3 HumanEval prompts x 128 tokens
    python benchmarks/plain_path.py --prompts 2 --tokens 64 --repeats 2
    python benchmarks/plain_path.py --batched             # the batch scheduler (draft-model planner)
    python benchmarks/plain_path.py --batched --drafter auto --prompt-set chat --temperature 0.6
                                                          # the server's default, n-gram lookups included

Each plain step is one `llama_decode` of one token; the benchmark wraps the backend's
`llama_decode` and its logits copy with timers and runs redwood's engine autoregressively
(greedy, EOS ignored, the prompt prefilled first and excluded); --batched runs `redwood
serve`'s default instead, the continuous-batching scheduler, with one request at a time (its
planner finds no tree that pays on a 2-core CPU, so every step is plain); `--drafter auto` (the
server's default) or `ngram` adds the n-gram drafter's lookup to every step, and on prompts
where it never drafts (most chat answers) every step stays plain, so "outside" shows what a
drafter that does not draft costs. "outside" = the step's wall time minus its llama_decode time:
what a C++ loop around the same call would not pay. Target
(issue: never slower than llama-server): outside <= 1.5 % of a plain step. Writes JSON under
benchmarks/results/.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path


class TimedLlama:
    """The llama_cpp module with llama_decode timed (everything else passed through): its total
    seconds and calls, and every call's (start, end) on perf_counter (CLOCK_MONOTONIC: the same
    clock in another process)."""

    def __init__(self, module):
        self._module, self.seconds, self.calls = module, 0.0, 0
        self.spans: list[tuple[float, float]] = []

    def __getattr__(self, name):
        return getattr(self._module, name)

    def llama_decode(self, ctx, batch):
        start = time.perf_counter()
        try:
            return self._module.llama_decode(ctx, batch)
        finally:
            end = time.perf_counter()
            self.seconds += end - start
            self.calls += 1
            self.spans.append((start, end))


def common_arguments(parser) -> None:
    """The prompts, lengths and temperature both path benchmarks take."""
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")


def timed_method(obj, name: str, totals: dict) -> None:
    original = getattr(obj, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - start
    setattr(obj, name, wrapper)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(parser)
    parser.add_argument("--batched", action="store_true",
                        help="time the server's batch scheduler instead of the engine")
    parser.add_argument("--drafter", default="model", choices=("model", "ngram", "auto"),
                        help="the batch scheduler's drafter (--batched; the server's default "
                             "is auto)")
    parser.add_argument("--prompt-set", default="humaneval", choices=("humaneval", "chat"))
    parser.add_argument("--out-dir", default="benchmarks/results")
    args = parser.parse_args(argv)
    rows, threads = (batched_rows if args.batched else engine_rows)(args)
    write(args, rows, threads)
    return 0


def row(repeat: int, prompt: int, n: int, wall: float, decode: float, copy: float,
        tokens: int | None = None) -> dict:
    r = {"repeat": repeat, "prompt": prompt, "steps": n, "tokens": tokens or n,
         "wall_ms": 1e3 * wall / n,
         "decode_ms": 1e3 * decode / n, "logits_copy_ms": 1e3 * copy / n,
         "outside_ms": 1e3 * (wall - decode) / n, "load_average": os.getloadavg()[0]}
    print(f"repeat {repeat} prompt {prompt}: {r['tokens']} tokens in {n} steps, "
          f"{r['wall_ms']:.2f} ms/step, llama_decode "
          f"{r['decode_ms']:.2f}, outside {r['outside_ms']:.3f} "
          f"({100 * r['outside_ms'] / r['wall_ms']:.2f} %), of which the logits copy "
          f"{r['logits_copy_ms']:.3f}", file=sys.stderr)
    return r


def batched_rows(args) -> tuple[list, int]:
    """The batch scheduler, one request at a time: each request's prompt is prefilled (and
    its first token sampled) before the timed steps start."""
    from redwood.decode.params import SamplingParams
    from redwood.serve.batch_setup import load_batch_scheduler
    from redwood.serve.batch_requests import BatchRequest

    scheduler, tokenizer = load_batch_scheduler(progress=False, prefix_cache=False,
                                                drafter=args.drafter)
    backend = scheduler.target.backend
    timed = TimedLlama(backend._llama)
    backend._llama = timed
    prompts = [ids.tolist() for ids in prompt_ids(tokenizer, args)]
    rows = []
    for repeat in range(args.repeats):
        for i, ids in enumerate(prompts):
            request = scheduler.submit(BatchRequest(ids, SamplingParams(
                args.tokens, args.temperature, seed=repeat), stop_on_eos=False))
            while not request.tokens:                    # prefill and the first token
                scheduler.step()
            timed.seconds, timed.calls = 0.0, 0
            start = time.perf_counter()
            while scheduler.step():
                pass
            rows.append(row(repeat, i, timed.calls, time.perf_counter() - start,
                            timed.seconds, 0.0, len(request.tokens) - 1))
    return rows, backend.n_threads


def prompt_ids(tokenizer, args) -> list:
    from redwood.prompts import encode_prompt, humaneval_prompts

    if args.prompt_set == "chat":
        from redwood.chat_prompts import chat_prompts

        return [encode_prompt(tokenizer, text, chat=True)
                for _, _, text in chat_prompts(args.prompts)]
    return [encode_prompt(tokenizer, p) for p in humaneval_prompts("evaluation",
                                                                   limit=args.prompts)]


def engine_rows(args) -> tuple[list, int]:
    """The engine autoregressively: the prefill's token is excluded from the timed steps."""
    from redwood.decode.engine import Engine
    from redwood.models.runtime import load_models
    from redwood.plan.tree import Tree

    models = load_models(backend="llamacpp")
    target = models.target
    timed = TimedLlama(target._llama)
    target._llama = timed
    totals: dict = {}
    timed_method(target, "_logits", totals)
    engine = Engine(target, models.draft, Tree([-1]))
    prompts = prompt_ids(models.tokenizer, args)
    rows = []
    for repeat in range(args.repeats):
        for i, ids in enumerate(prompts):
            stream = engine.stream(ids, args.tokens, method="autoregressive", stop_on_eos=False,
                                   temperature=args.temperature, seed=repeat,
                                   cache_prompt=False)
            steps = iter(stream)
            next(steps)                                  # the prefill's token: excluded
            timed.seconds, timed.calls = 0.0, 0
            totals.clear()
            start = time.perf_counter()
            for _ in steps:
                pass
            rows.append(row(repeat, i, timed.calls, time.perf_counter() - start,
                            timed.seconds, totals.get("_logits", 0.0)))
    return rows, target.n_threads


def write(args, rows: list, threads: int) -> None:
    import torch

    from redwood.bench.server_run import cpu_description

    share = [r["outside_ms"] / r["wall_ms"] for r in rows]
    doc = {"cpu": cpu_description(), "torch_threads": torch.get_num_threads(),
           "llama_threads": threads, "batched": args.batched, "tokens": args.tokens,
           "drafter": args.drafter if args.batched else None, "prompt_set": args.prompt_set,
           "temperature": args.temperature, "rows": rows,
           "outside_share_median": statistics.median(share), "outside_share_max": max(share),
           "outside_ms_median": statistics.median(r["outside_ms"] for r in rows),
           "step_ms_median": statistics.median(r["wall_ms"] for r in rows)}
    doc["cpu"].pop("flags")
    kind = "plain-path-batched" if args.batched else "plain-path"
    if args.batched and args.drafter != "model":
        kind += f"-{args.drafter}"
    if args.prompt_set != "humaneval":
        kind += f"-{args.prompt_set}"
    out = Path(args.out_dir) / (f"{kind}-T{args.temperature:g}-"
                                f"{datetime.date.today().isoformat()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"outside llama_decode: median {100 * doc['outside_share_median']:.2f} % of a plain "
          f"step ({doc['outside_ms_median']:.3f} of {doc['step_ms_median']:.2f} ms), max "
          f"{100 * doc['outside_share_max']:.2f} %; wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
