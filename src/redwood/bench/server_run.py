"""`redwood bench --servers METHOD ...`: set up, run (bench.server_bench), write the results
(bench.server_report): <machine>-servers-<date>.json (summary, how it was made),
.raw.json (every request) and .md (the table), under --out-dir."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path

from redwood.bench.server_bench import ServerBenchConfig, run_requests, start_servers, stop_servers
from redwood.bench.server_report import (markdown_table, noise_floor, ratios,
                                         speculation_figures, speculation_table, stray_rounds)
from redwood.bench.server_specs import BASELINE, METHODS, ServerSetup, check_methods
from redwood.decode.ngram_acceptance import MATCH_LABELS
from redwood.errors import RedwoodError
from redwood.measure.learned_rates import learning_kept

DEFAULT_LLAMA_SERVER = Path(".venv/llama-server/build/bin/llama-server")


def find_llama_server(given: str | None) -> str | None:
    """--llama-server, else $REDWOOD_LLAMA_SERVER, else what `make llama-server` built."""
    for candidate in (given, os.environ.get("REDWOOD_LLAMA_SERVER"), DEFAULT_LLAMA_SERVER):
        if candidate and Path(candidate).is_file():
            return str(Path(candidate).resolve())
        if candidate == given and given:
            raise RedwoodError(f"--llama-server {given} does not exist")
    return None


def cpu_description() -> dict:
    """The CPU model, its flags and SIMD level, for the report."""
    from redwood.measure.machine_profile import cpu_model

    info = {"model": cpu_model(), "flags": "", "cores": os.cpu_count()}
    try:
        info["flags"] = next((line.split(":", 1)[1].strip() for line in
                              Path("/proc/cpuinfo").read_text().splitlines()
                              if line.startswith("flags")), "")
    except OSError:
        pass
    info["simd"] = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
                    if f in info["flags"].split()]
    return info


class PromptEncoder:
    """What bench.prompt_sets needs of a pair: a tokenizer and raw-text encoding."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, texts):
        from redwood.prompts import encode_prompt

        return [encode_prompt(self.tokenizer, text) for text in texts]


def server_setup(llama_server: str | None, target: str | None, draft: str | None):
    """(ServerSetup, tokenizer) for the shipped pair or explicit GGUF files."""
    from redwood.models.hf_loading import load_tokenizer
    from redwood.backends.llamacpp_native import free_cores

    if (target is None) != (draft is None):
        raise RedwoodError("give both --target and --draft, or neither (the shipped pair)")
    if target is None:
        from redwood.models.shipped import shipped_gguf_pair, shipped_tokenizer_dir

        target_path, draft_path = shipped_gguf_pair()
        tokenizer = load_tokenizer(shipped_tokenizer_dir())
        model_args: tuple[str, ...] = ()
    else:
        target_path, draft_path = target, draft
        tokenizer = load_tokenizer(target)
        model_args = ("--target", str(target), "--draft", str(draft))
    return ServerSetup(str(target_path), str(draft_path), free_cores(),
                       llama_server=llama_server, redwood_model_args=model_args), tokenizer


def run_servers_command(config: ServerBenchConfig, llama_server: str | None = None,
                        target: str | None = None, draft: str | None = None,
                        command_line: str = "") -> dict:
    from redwood.bench.prompt_sets import describe_sets, load_prompt_sets

    config.check()
    methods = check_methods(config.methods)
    binary = find_llama_server(llama_server)
    setup, tokenizer = server_setup(binary, target, draft)
    prompts, notes = load_prompt_sets(PromptEncoder(tokenizer), config.prompt_sets, config.prompts)
    out_dir = Path(config.out_dir)
    log_dir = Path(config.log_dir) if config.log_dir else out_dir / "server-logs"
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    records = measure(config, methods, setup, prompts, log_dir)
    doc = summarise(config, methods, records, setup, describe_sets(prompts),
                    notes + run_notes(config))
    doc.update(command=command_line, started=started, finished=time.strftime("%Y-%m-%d %H:%M:%S"))
    return write(config, doc, records)


def measure(config: ServerBenchConfig, methods, setup: ServerSetup, prompts,
            log_dir: Path) -> list:
    """Every round's records: the servers started once, or (config.fresh_rounds) afresh before
    each round and each temperature in it, so a prompt's request at one temperature never finds
    its answer at another in a server's memory. A round cut short by Ctrl-C ends the run with
    what every method answered."""
    temperatures = tuple(config.temperatures)
    chunks = [(range(r, r + 1), (t,)) for r in range(config.rounds) for t in temperatures] \
        if config.fresh_rounds else [(range(config.rounds), temperatures)]
    records: list = []
    for rounds, temps in chunks:
        servers = start_servers(methods, setup, log_dir)
        try:
            got = run_requests(config, prompts, {name: s.url for name, s in servers.items()},
                               servers=servers, rounds=rounds, temperatures=temps)
        finally:
            stop_servers(servers)
        records += got
        if len(got) < len(rounds) * len(temps) * len(prompts) * len(methods):
            break                                       # interrupted: keep what was measured
    return records


def run_notes(config: ServerBenchConfig) -> list[str]:
    """What the report must say about how the run was ordered."""
    if len(config.temperatures) > 1 and not config.fresh_rounds:
        return ["each round asked every prompt at every temperature on the same servers, in "
                "the order given: a server that learns across requests (redwood's memory of "
                "earlier answers, ngram-mod's pool) answered a prompt's later temperatures "
                "having seen its answer at the earlier ones; --fresh-rounds starts the servers "
                "afresh for each temperature"]
    return []


def summarise(config, methods, records, setup, sets: dict, notes: list[str]) -> dict:
    summary = ratios(records)
    names = [m.name for m in methods]
    return {
        "kind": "server-bench", "format": 1, "cpu": cpu_description(),
        "load_average_max": max(r.load_average for r in records),
        "config": dataclasses.asdict(config), "setup": dataclasses.asdict(setup),
        "methods": {n: METHODS[n].description for n in names}, "baseline": BASELINE,
        "prompt_sets": sets, "notes": notes, "llama_server_build": _build_info(setup),
        "stray_rounds": stray_rounds(records), "speculation": speculation_figures(records),
        "noise_floor": noise_floor(summary),
        # redwood's servers keep their learnt n-gram rates on disk (measure/learned_rates.py),
        # so they carry over between fresh rounds unless turned off
        "learned_rates": learning_kept(),
        "table": markdown_table(summary, names, list(config.prompt_sets), config.temperatures),
        # llama-server's ngram-mod keeps one hash pool across requests, so from the second
        # round on it has seen every answer before: the first round is what a prompt it has
        # not seen gets
        "first_round_table": markdown_table(ratios([r for r in records if r.round == 0]), names,
                                            list(config.prompt_sets), config.temperatures),
        "results": [{"prompt_set": s, "temperature": t, "method": m, **entry}
                    for (s, t, m), entry in sorted(summary.items())],
    }


def _build_info(setup: ServerSetup) -> dict:
    if not setup.llama_server:
        return {}
    build = Path(setup.llama_server).parents[2] / "build.json"
    info = json.loads(build.read_text()) if build.is_file() else {}
    try:
        out = subprocess.run([setup.llama_server, "--version"], capture_output=True, text=True,
                             timeout=30)
        info["version"] = (out.stdout + out.stderr).strip().splitlines()[-2:]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


def write(config: ServerBenchConfig, doc: dict, records) -> dict:
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{config.machine or 'cpu-%dcore' % (os.cpu_count() or 1)}-servers-{time.strftime('%Y-%m-%d')}"
    paths = {"json": out_dir / f"{stem}.json", "raw": out_dir / f"{stem}.raw.json",
             "markdown": out_dir / f"{stem}.md"}
    paths["json"].write_text(json.dumps(doc, indent=1) + "\n")
    paths["raw"].write_text(json.dumps([dataclasses.asdict(r) for r in records], indent=1) + "\n")
    paths["markdown"].write_text(render_markdown(doc))
    print(doc["table"])
    return {k: str(v) for k, v in paths.items()}


def render_markdown(doc: dict) -> str:
    cpu = doc["cpu"]
    temps = " / ".join(f"T = {t:g}" for t in doc["config"]["temperatures"])
    lines = [f"# Servers through one HTTP client ({doc['started']})", "",
             f"`{doc['command']}`", "",
             f"- cpu: {cpu['model']}, {cpu['cores']} cores, SIMD {', '.join(cpu['simd']) or '-'}",
             f"- highest 1-min load average seen: {doc['load_average_max']:.2f}",
             f"- llama-server build: {doc['llama_server_build']}",
             f"- {doc['config']['rounds']} rounds, methods rotating per prompt, natural stop "
             f"(max_tokens {doc['config']['max_tokens']}), one request at a time"
             + ("; every server started afresh before each round (--fresh-rounds: each round "
                "is every server's first sight of the prompts)"
                if doc["config"].get("fresh_rounds") else "")
             + ("; redwood's learnt n-gram acceptance rates carry over between processes "
                "($REDWOOD_CACHE/acceptance/; REDWOOD_LEARNED_RATES=0 starts each from the "
                "priors)" if doc.get("learned_rates") else ""), "",
             "## Results", "",
             f"× plain llama-server, end to end (its request time over the method's, prefill "
             f"included; answers of another length compared at the method's length with "
             f"llama-server's decode cost per token), from each method's fastest round per "
             f"prompt: median over prompts (worst prompt), {temps}", "", doc["table"], ""]
    if doc.get("first_round_table"):
        lines += ["The first round alone (every request new to every server; llama-server's "
                  "ngram-mod and redwood's n-gram learning carry over between requests):", "",
                  doc["first_round_table"], ""]
    if doc.get("noise_floor"):
        lines += [doc["noise_floor"], ""]
    if doc["stray_rounds"]:
        lines += ["Rounds whose plain llama-server rate strayed > 10 % from its median: "
                  + ", ".join(f"round {s['round']} ({s['baseline_tokens_per_s']:.1f} vs "
                              f"{s['median_tokens_per_s']:.1f} tok/s)" for s in doc["stray_rounds"]), ""]
    lines += ["## Per set", "", "| set | T | method | tok/s (median prompt) | × median rounds | "
              "identical to plain | median tokens |", "|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        lines.append(f"| {r['prompt_set']} | {r['temperature']:g} | {r['method']} | "
                     f"{r['tokens_per_s']:.1f} | {r['median']['median']:.2f} "
                     f"({r['median']['worst']:.2f}) | {r['identical']}/{r['prompts']} | "
                     f"{r['median_tokens']:g} |")
    if doc["speculation"]:
        lines += ["", "## Speculation per set, as the servers report it", "",
                  "Pooled over every request of a set and round; match-length cells: the "
                  "share of proposed n-gram draft tokens the target kept (proposed).", "",
                  speculation_table(doc["speculation"], MATCH_LABELS)]
    return "\n".join(lines) + "\n"


def rewrite(raw_path: str) -> dict:
    """Summarise a run again from its raw records (after the report changed): the summary JSON
    beside it gives the config and setup; writes the .json and .md again."""
    raw = Path(raw_path)
    summary_path = raw.with_name(raw.name.replace(".raw.json", ".json"))
    old = json.loads(summary_path.read_text())
    from redwood.bench.server_bench import Record

    records = [Record(**r) for r in json.loads(raw.read_text())]
    config = ServerBenchConfig(**{**old["config"], "prompt_sets": tuple(old["config"]["prompt_sets"]),
                                  "temperatures": tuple(old["config"]["temperatures"])})
    setup = ServerSetup(**{**old["setup"], "redwood_model_args": tuple(old["setup"]["redwood_model_args"])})
    doc = summarise(config, check_methods(config.methods), records, setup, old["prompt_sets"],
                    old["notes"])
    doc.update(command=old["command"], started=old["started"], finished=old["finished"],
               learned_rates=old.get("learned_rates", False))    # as the run had it
    summary_path.write_text(json.dumps(doc, indent=1) + "\n")
    raw.with_name(raw.name.replace(".raw.json", ".md")).write_text(render_markdown(doc))
    return doc
