"""Load test: many concurrent clients against the server, loopback only, every wait bounded.

    python benchmarks/load_test.py                       # shipped pair, 1 2 4 8 16 clients
    python benchmarks/load_test.py --quick               # tiny random GGUF pair, seconds

For each method and each concurrency c, c client threads each send `--requests` streaming
completions one after another (HumanEval evaluation prompts, greedy, `--max-tokens` each) and
record, per request, the time to the first token and the per-token latency after it ((time of
the last token - time of the first) / (tokens - 1)); a token's time is when its text arrives
(tokens that decode to no text, rare with real models, arrive with the next text). Reported per
(method, c): aggregate tokens/s (all completion tokens / wall time of the level), p50 / p95 of
both latencies.

Methods (each server a subprocess on 127.0.0.1, started once per method, asked through the
same client):
- batched-spec:   `redwood serve --max-batch 16` with its default drafter (on llama.cpp prompt
  lookup, trees of requests decoding together sized jointly; with --drafter model, trees
  planned per batch where they pay);
- batched-plain:  --max-batch 16 --method autoregressive (continuous batching, no draft);
- one-at-a-time:  --max-batch 1 (the single-request engine; --tree auto on the shipped pair);
- llama-server:   llama.cpp's own server on the same target GGUF (`make llama-server`, or
  --llama-server PATH), plain, with as many slots as the largest client count (`-np`, each
  slot 1,024 cells of a shared `-c`) so it batches concurrent requests as redwood does;
- llama-server-spec: the same with `--spec-default` (its n-gram speculation);
- llama-cpp-python: its high-level `Llama` holds ONE sequence and batches nothing (its own
  server serialises requests behind a lock), so it is measured as that: one Llama over the
  target GGUF, same threads, requests served one at a time in this process (no HTTP: this
  flatters it slightly).
Prompts: every request of a method's run gets its own prompt, never one sent before in that
run: request k of client i at a level gets prompt 1 + offset + i * requests + k, where offset
counts the requests of the earlier levels, and the untimed warm-up gets prompt 0. Reusing prompts
would flatter llama-cpp-python: its `Llama` keeps its KV cache and reuses the longest prefix a
new prompt shares with the previous one, so a repeated prompt costs no prefill (an earlier run
re-sent the same first prompts at every level and its TTFT p50 was 44 ms while every redwood
server paid a full prefill). Prompts that merely start alike (HumanEval's "from typing import
List" headers) still share those tokens there, as any prefix cache would. The default run needs
1 + 31 x 3 = 94 prompts of HumanEval's 124 evaluation problems; a run that needs more wraps
around and says so in its printed header and in the JSON meta (`prompts`). Every method gets the
same prompt at the same place.
Do not run anything else on the machine while it runs. Writes JSON + markdown under
benchmarks/results/; the JSON meta records the CPU model and the torch, llama-cpp-python and
redwood versions.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
HOST = "127.0.0.1"                     # loopback only, never anything else
METHODS = ("batched-spec", "batched-plain", "one-at-a-time", "llama-server", "llama-server-spec",
           "llama-cpp-python")
SERVER_FLAGS = {"batched-spec": ["--max-batch", "16"],
                "batched-plain": ["--max-batch", "16", "--method", "autoregressive"],
                "one-at-a-time": ["--max-batch", "1"]}
LLAMA_SERVER_METHODS = {"llama-server": "llama-server",                 # server_specs names
                        "llama-server-spec": "llama-server-spec-default"}
SLOT_CELLS = 1024                      # llama-server: KV cells per slot


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny random GGUF pair (a few seconds)")
    p.add_argument("--target", help="target GGUF (default: the shipped pair)")
    p.add_argument("--draft", help="draft GGUF")
    p.add_argument("--concurrency", type=int, nargs="+", default=None,
                   help="client counts (default 1 2 4 8 16; --quick: 1 2 4)")
    p.add_argument("--requests", type=int, default=None,
                   help="sequential requests per client (default 3; --quick: 2)")
    p.add_argument("--max-tokens", type=int, default=None, help="default 64; --quick: 16")
    p.add_argument("--methods", nargs="+", default=None, choices=METHODS,
                   help="default: all, the llama-server ones where a binary is found")
    p.add_argument("--llama-server", default=None,
                   help="llama-server binary (default: $REDWOOD_LLAMA_SERVER, else what "
                        "`make llama-server` built)")
    p.add_argument("--startup-timeout", type=float, default=900.0,
                   help="seconds a server may take to load (first use measures a profile)")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--out", default=None, help="result file stem (default: dated)")
    return p.parse_args(argv)


# -- models and prompts ----------------------------------------------------------------------

def model_args(args) -> tuple[list[str], str, str | None]:
    """(server model flags, target path for llama-cpp-python, tokenizer source note)."""
    if args.quick:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from tiny_gguf import write_perturbed_gguf, write_tiny_gguf

        directory = Path(tempfile.mkdtemp(prefix="redwood-load-"))
        target = write_tiny_gguf(directory / "tiny-target.gguf", 0)
        draft = write_perturbed_gguf(directory / "tiny-draft.gguf", 0, 0.1)
        return ["--target", str(target), "--draft", str(draft)], str(target), None
    if args.target:
        return ["--target", args.target, "--draft", args.draft], args.target, None
    from redwood.models.shipped import shipped_gguf_pair

    target, draft = shipped_gguf_pair()
    return ["--model", "qwen2.5-coder"], str(target), "qwen2.5-coder"


def prompts_needed(args) -> int:
    """The warm-up's prompt plus one per request of every level (module doc)."""
    return 1 + sum(args.concurrency) * args.requests


def prompts(args) -> list[str]:
    """Up to prompts_needed(args) distinct prompts (fewer only if the set is smaller)."""
    needed = prompts_needed(args)
    if args.quick:
        return [f"def f{i}(x):\n    return x * {i} +" for i in range(needed)]
    from redwood.prompts import humaneval_prompts

    return humaneval_prompts("evaluation", limit=needed)


# -- servers ------------------------------------------------------------------------------------

def start_server(method: str, flags: list[str], target: str, args, log_path: Path):
    """The method's server, started and answering /health (bench.server_process)."""
    from redwood.bench.server_process import ServerProcess, free_port
    from redwood.bench.server_specs import METHODS as SPECS
    from redwood.bench.server_specs import ServerSetup, command

    port = free_port()
    if method in LLAMA_SERVER_METHODS:
        from redwood.backends.llamacpp_native import free_cores

        slots = max(args.concurrency)
        setup = ServerSetup(target, "", free_cores(), SLOT_CELLS * slots, args.llama_server,
                            slots=slots)
        argv = command(SPECS[LLAMA_SERVER_METHODS[method]], setup, port)
    else:
        argv = [sys.executable, "-m", "redwood.cli", "serve", "--host", HOST, "--port", str(port),
                "--max-queue", "64", "--max-tokens", str(args.max_tokens)] + flags
    return ServerProcess(method, argv, port, log_path, args.startup_timeout).start(
        lambda note: print(note, flush=True))


_local = threading.local()


def http_request(url: str, prompt: str, args) -> dict:
    """One streaming completion through the openai client (one client per thread): arrival
    times of its tokens."""
    import openai

    client = getattr(_local, "client", None)
    if client is None or getattr(_local, "url", None) != url:
        client = _local.client = openai.OpenAI(base_url=url + "/v1", api_key="unused",
                                               max_retries=0, timeout=args.request_timeout)
        _local.url = url
    start = time.perf_counter()
    times, tokens = [], None
    stream = client.completions.create(model="m", prompt=prompt, max_tokens=args.max_tokens,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            times.append(time.perf_counter())
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    # a server that sends no usage chunk streams one token per chunk (llama-server does)
    return {"start": start, "first": times[0] if times else None,
            "last": times[-1] if times else None,
            "tokens": tokens if tokens is not None else len(times)}


class SerialLlama:
    """llama-cpp-python's own decoding: one high-level Llama, requests one at a time."""

    def __init__(self, target: str):
        from llama_cpp import Llama

        from redwood.backends.llamacpp_native import free_cores

        self.llama = Llama(target, n_ctx=4096, n_threads=free_cores(),
                           n_threads_batch=free_cores(), verbose=False)
        self.lock = threading.Lock()

    def request(self, prompt: str, args) -> dict:
        start = time.perf_counter()
        times, tokens = [], 0
        with self.lock:
            for chunk in self.llama.create_completion(prompt, max_tokens=args.max_tokens,
                                                      temperature=0.0, stream=True):
                tokens += 1
                if chunk["choices"][0]["text"]:
                    times.append(time.perf_counter())
        return {"start": start, "first": times[0] if times else None,
                "last": times[-1] if times else None, "tokens": tokens}


# -- one concurrency level -------------------------------------------------------------------

def run_level(send, texts: list[str], clients: int, args, offset: int) -> dict:
    """`clients` threads, `args.requests` requests each; bounded by the request timeout.
    Request k of client i sends texts[1 + offset + i * requests + k] (texts[0] is the warm-up's;
    it wraps around only when the run needs more prompts than there are, module doc)."""
    records, errors = [], []
    lock = threading.Lock()

    def client(index: int) -> None:
        for k in range(args.requests):
            try:
                record = send(texts[(1 + offset + index * args.requests + k) % len(texts)])
            except Exception as exc:               # a failure is reported, never hidden
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            with lock:
                records.append(record)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.request_timeout * args.requests)
    wall = time.perf_counter() - start
    return summarise(records, errors, wall, clients)


def summarise(records: list[dict], errors: list[str], wall: float, clients: int) -> dict:
    def pct(values, q):
        if not values:
            return None
        values = sorted(values)
        return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]

    ttft = [r["first"] - r["start"] for r in records if r["first"] is not None]
    per_token = [(r["last"] - r["first"]) / (r["tokens"] - 1) for r in records
                 if r["first"] is not None and r["tokens"] > 1]
    tokens = sum(r["tokens"] for r in records)
    return {"clients": clients, "requests": len(records), "errors": errors, "wall_s": wall,
            "tokens": tokens, "tokens_per_s": tokens / wall if wall else None,
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p95_s": pct(ttft, 0.95),
            "per_token_p50_s": pct(per_token, 0.5), "per_token_p95_s": pct(per_token, 0.95),
            "mean_per_token_s": statistics.mean(per_token) if per_token else None}


# -- main --------------------------------------------------------------------------------------

def run_method(method: str, flags: list[str], target: str, texts: list[str], args,
               stem: str) -> list[dict]:
    if method == "llama-cpp-python":
        serial = SerialLlama(target)
        return run_levels(method, lambda text: serial.request(text, args), texts, args)
    extra = list(SERVER_FLAGS.get(method, []))
    if method == "one-at-a-time" and "--model" in flags:
        extra += ["--tree", "auto"]            # the shipped pair's tuned bundle
    with start_server(method, flags + extra, target, args, RESULTS / f"{stem}-{method}.log") \
            as server:
        return run_levels(method, lambda text: http_request(server.url, text, args), texts, args)


def run_levels(method: str, send, texts: list[str], args) -> list[dict]:
    """The untimed warm-up on texts[0], then every concurrency level on prompts of its own."""
    send(texts[0])
    rows, offset = [], 0
    for clients in args.concurrency:
        rows.append(dict(method=method, **run_level(send, texts, clients, args, offset)))
        offset += clients * args.requests
        print(format_row(rows[-1]), flush=True)
    return rows


def check_methods(args) -> list[str]:
    """The methods to run: as asked (llama-server ones need the binary), else every method,
    the llama-server ones only where a binary is found (said so)."""
    from redwood.bench.server_run import find_llama_server

    args.llama_server = find_llama_server(args.llama_server)
    if args.methods:
        if args.llama_server is None and set(args.methods) & set(LLAMA_SERVER_METHODS):
            raise SystemExit("llama-server methods need the binary: run `make llama-server` "
                             "or pass --llama-server PATH")
        return list(args.methods)
    if args.llama_server is None:
        print("no llama-server binary (`make llama-server`): its methods are skipped", flush=True)
        return [m for m in METHODS if m not in LLAMA_SERVER_METHODS]
    return list(METHODS)


def prompts_note(available: int, needed: int) -> dict:
    """What the JSON meta and the header say about the prompts (module doc)."""
    wrapped = needed > available
    note = (f"{needed} prompts needed, only {available} distinct: prompts WRAP AROUND (repeats "
            f"can hit llama-cpp-python's prefix cache)" if wrapped else
            f"{needed} distinct prompts (warm-up + one per request)")
    return {"needed": needed, "distinct": min(available, needed), "wrapped": wrapped,
            "note": note}


def versions() -> dict:
    """Installed versions (from package metadata: nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "llama-cpp-python", "redwood"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    return found


def format_row(row: dict) -> str:
    def ms(value):
        return f"{1000 * value:8.1f}" if value is not None else "       -"
    return (f"| {row['method']:17} | {row['clients']:3d} | {row['tokens_per_s'] or 0:8.2f} | "
            f"{ms(row['ttft_p50_s'])} | {ms(row['ttft_p95_s'])} | {ms(row['per_token_p50_s'])} | "
            f"{ms(row['per_token_p95_s'])} | {len(row['errors']):3d} |")


HEADER = ("| method            |   c | tokens/s | TTFT p50 | TTFT p95 | tok p50  | tok p95  "
          "| err |\n|-------------------|-----|----------|----------|----------|----------|"
          "----------|-----|")


def main(argv=None) -> int:
    args = parse_args(argv)
    quick = args.quick
    args.concurrency = args.concurrency or ([1, 2, 4] if quick else [1, 2, 4, 8, 16])
    args.requests = args.requests or (2 if quick else 3)
    args.max_tokens = args.max_tokens or (16 if quick else 64)
    if min(args.concurrency) < 1 or args.requests < 1 or args.max_tokens < 1:
        raise SystemExit("--concurrency, --requests and --max-tokens must be positive")
    args.methods = check_methods(args)
    RESULTS.mkdir(exist_ok=True)
    stem = args.out or f"load-test-{'tiny' if args.quick else 'cpu'}-{datetime.date.today()}"
    flags, target, _ = model_args(args)
    texts = prompts(args)
    prompt_note = prompts_note(len(texts), prompts_needed(args))
    print(f"load test: {args.methods}, clients {args.concurrency}, {args.requests} requests "
          f"each, {args.max_tokens} tokens, load average {os.getloadavg()[0]:.2f}; "
          f"{prompt_note['note']}", flush=True)
    print("latencies in ms\n" + HEADER, flush=True)
    rows = []
    for method in args.methods:
        rows += run_method(method, flags, target, texts, args, stem)
    from redwood.measure.machine_profile import cpu_model

    meta = {"argv": sys.argv[1:], "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
            "load_average_after": os.getloadavg()[0], "versions": versions(),
            "prompts": prompt_note,
            "llama_cpp_python": "no request batching in its high-level API: measured serially",
            "llama_server": {"binary": args.llama_server, "slots": max(args.concurrency),
                             "cells_per_slot": SLOT_CELLS}}
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (RESULTS / f"{stem}.md").write_text(
        f"Load test ({', '.join(args.methods)}), {args.requests} requests per client, "
        f"{args.max_tokens} tokens each; latencies in ms (TTFT: time to first token; tok: per "
        f"token after the first); {prompt_note['note']}.\n\n"
        + HEADER + "\n" + "\n".join(map(format_row, rows)) + "\n")
    print(f"wrote {RESULTS / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
