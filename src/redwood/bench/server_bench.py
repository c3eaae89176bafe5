"""`redwood bench --servers ...`: servers against servers, through one HTTP client.

Every method is a server process (bench.server_specs: llama-server plain and its speculative
modes, redwood serve's default and drafters) started once, all up at once on loopback ports
(the GGUF weights are memory-mapped, so the processes share one copy). Then, per round, per
temperature, per prompt, every method answers the same /v1/completions request (token-id
prompt, natural stop at EOS or max_tokens, `cache_prompt: false`, samplers neutral except
temperature), in an order that rotates from prompt to prompt and round to round, so drift of a
shared machine spreads over every method. The client times each request end to end
(bench.http_client). One request at a time, and every other server is paused (SIGSTOP) while
one answers: with five idle servers up, their poll loops and thread pools slowed the one at work
by about 10 % on 2 cores. bench.server_report turns the records into ratios to plain
llama-server.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from redwood.bench.http_client import complete
from redwood.bench.server_process import ServerProcess, free_port
from redwood.bench.server_specs import ServerSetup, check_methods, command
from redwood.errors import RedwoodError


@dataclass
class ServerBenchConfig:
    methods: list[str]
    prompt_sets: tuple[str, ...] = ("chat", "humaneval", "whole_file")
    prompts: int = 10
    rounds: int = 3
    temperatures: tuple[float, ...] = (0.0,)
    max_tokens: int = 512
    seed: int = 0
    stream: bool = False
    # keep each server's prompt cache (as agents and chat UIs run): a request reuses what the
    # server's previous request shares with it; off, every request evaluates its whole prompt
    cache_prompt: bool = False
    # start every server afresh before each round and each temperature: nothing a server learnt
    # in one (redwood's memory of earlier answers, ngram-mod's hash pool, prompt caches) reaches
    # the next, so each is every server's first sight of the prompts and a per-prompt minimum
    # over rounds measures first sight, not a repeated request
    fresh_rounds: bool = False
    out_dir: str = "benchmarks/results"
    machine: str | None = None
    log_dir: str | None = None             # server logs (default: <out_dir>/server-logs)

    def check(self) -> None:
        if self.prompts < 1 or self.rounds < 1 or self.max_tokens < 1:
            raise RedwoodError("--prompts, --rounds and --max-new-tokens must be at least 1")
        if not self.temperatures or any(not 0 <= t <= 2 for t in self.temperatures):
            raise RedwoodError("--temperatures must be in [0, 2]")
        check_methods(self.methods)


@dataclass
class Record:
    """One request of the run."""
    round: int
    prompt_set: str
    prompt: str
    temperature: float
    method: str
    order: int                             # its place among the methods for this prompt
    prompt_tokens: int
    wall_seconds: float
    completion_tokens: int
    finish_reason: str | None
    ttft_seconds: float | None
    text: str
    load_average: float
    extra: dict = field(default_factory=dict)


def request_body(ids, temperature: float, seed: int, max_tokens: int, stream: bool,
                 cache_prompt: bool = False) -> dict:
    """The body every server gets: a token-id prompt, neutral samplers but temperature (no
    top-k/min-p/typical/repetition penalty: llama-server's defaults would change the law),
    no prompt cache unless asked (every request evaluates its whole prompt), natural stop."""
    body = {"prompt": [int(t) for t in ids], "max_tokens": int(max_tokens),
            "temperature": float(temperature), "top_p": 1.0, "top_k": 0, "min_p": 0.0,
            "typical_p": 1.0, "repeat_penalty": 1.0, "seed": int(seed),
            "cache_prompt": bool(cache_prompt), "stream": bool(stream)}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def rotated(items: list, shift: int) -> list:
    shift %= len(items)
    return items[shift:] + items[:shift]


def start_servers(methods, setup: ServerSetup, log_dir: Path, progress=print) -> dict:
    """{name: started ServerProcess}; on a failure every started one is stopped."""
    servers: dict[str, ServerProcess] = {}
    try:
        for method in methods:
            port = free_port()
            server = ServerProcess(method.name, command(method, setup, port), port,
                                   log_dir / f"{method.name}.log")
            progress(f"starting {method.name}: {' '.join(server.argv)}")
            servers[method.name] = server.start(progress)
            progress(f"  up in {server.started_seconds:.1f} s")
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: dict) -> None:
    for server in servers.values():
        server.stop()


def run_requests(config: ServerBenchConfig, prompts, urls: dict[str, str],
                 progress=print, servers: dict | None = None,
                 rounds: range | None = None,
                 temperatures: tuple[float, ...] | None = None) -> list[Record]:
    """Every round (of `rounds`, default all) x temperature (of `temperatures`, default all)
    x prompt x method, methods rotating per prompt; a warm-up request per server first
    (untimed). Interrupted (Ctrl-C), it returns the records of the prompts every method
    answered, so a long run cut short still reports them. servers: {name: ServerProcess} to
    pause while another answers (None: nothing paused, e.g. servers this process does not
    own)."""
    names = list(urls)
    servers = servers or {}
    rounds = range(config.rounds) if rounds is None else rounds
    temperatures = tuple(config.temperatures) if temperatures is None else tuple(temperatures)
    if not prompts:
        raise RedwoodError("no prompts to run")
    for name in names:                                          # untimed warm-up
        complete(urls[name], request_body(prompts[0].ids[:16], 0.0, 0, 4, False))
    records: list[Record] = []
    total = len(rounds) * len(temperatures) * len(prompts) * len(names)
    start = time.perf_counter()
    try:                    # Ctrl-C keeps what was measured (whole prompts only)
        for r in rounds:
            for temperature in temperatures:
                for i, prompt in enumerate(prompts):
                    body = request_body(prompt.ids, temperature, config.seed + i, config.max_tokens,
                                        config.stream, config.cache_prompt)
                    for order, name in enumerate(rotated(names, i + r)):
                        reply = alone(name, servers, lambda: complete(urls[name], body))
                        tokens = reply.completion_tokens
                        if tokens is None:
                            raise RedwoodError(f"{name} gave no usage.completion_tokens")
                        records.append(Record(r, prompt.prompt_set, prompt.name, temperature, name,
                                              order, int(len(prompt.ids)), reply.wall_seconds,
                                              int(tokens), reply.finish_reason, reply.ttft_seconds,
                                              reply.text, os.getloadavg()[0], reply.extra))
                    done = len(records)
                    elapsed = time.perf_counter() - start
                    progress(f"round {r + 1}/{config.rounds} T={temperature:g} {prompt.name}: "
                             + ", ".join(f"{rec.method} "
                                         f"{rec.completion_tokens / rec.wall_seconds:.1f}"
                                         for rec in records[-len(names):])
                             + f" tok/s  [{done}/{total}, {elapsed / 60:.1f} min, "
                               f"~{elapsed / done * (total - done) / 60:.1f} min left]")
    except KeyboardInterrupt:
        whole = len(records) - len(records) % len(names)
        if not whole:
            raise
        progress(f"interrupted: keeping the {whole // len(names)} prompts every method answered")
        del records[whole:]
    return records


def alone(name: str, servers: dict, call):
    """call() with every server but `name` paused."""
    others = [s for n, s in servers.items() if n != name]
    for server in others:
        server.pause()
    try:
        return call()
    finally:
        for server in others:
            server.resume()
