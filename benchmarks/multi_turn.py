"""Multi-turn sessions through one HTTP client: what a chat UI or a coding agent sends (the whole
conversation every turn), with each server's prompt cache on (its default).

    python benchmarks/multi_turn.py --label plain            # 2 coding sessions x 3 turns, llama-server vs redwood
    python benchmarks/multi_turn.py --label ngram --methods llama-server redwood-ngram llama-server-spec-default

A session pastes a module (redwood.edit_tasks' whole-file tasks), asks for an edit that returns
the whole module, then two follow-up edits on the answer. Every turn's prompt is the chat
template over the conversation so far, as token ids, sent to /v1/completions (greedy, natural
stop, `cache_prompt` left on), so every server gets the same ids. Sessions alternate which
server goes first; idle servers are paused while one answers. Prints per turn and per session
wall time, prompt tokens and the cached tokens each server reports; writes JSON under
benchmarks/results/.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

FOLLOW_UPS = ("Now add a one-line comment above every function saying what it returns. "
              "Return the whole module.",
              "Now rename the parameter `l` to `values` wherever it appears. Return the whole module.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--methods", nargs="+", default=["llama-server", "redwood-batch1"])
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--label", default="", help="part of the output file's name")
    args = parser.parse_args(argv)

    from redwood.bench.http_client import complete
    from redwood.bench.server_bench import alone, request_body, start_servers, stop_servers
    from redwood.bench.server_run import cpu_description, find_llama_server, server_setup
    from redwood.bench.server_specs import check_methods
    from redwood.edit_tasks import edit_tasks
    from redwood.prompts import encode_chat

    setup, tokenizer = server_setup(find_llama_server(None), None, None)
    methods = check_methods(args.methods)
    servers = start_servers(methods, setup, Path(args.out_dir) / "server-logs")
    rows = []
    try:
        for s in range(args.sessions):
            task = edit_tasks("whole_file", s + 1)[s]
            order = [m.name for m in methods]
            order = order[s % len(order):] + order[:s % len(order)]
            for name in order:
                messages, start = [], time.perf_counter()
                for turn, text in enumerate((task.prompt,) + FOLLOW_UPS):
                    messages.append({"role": "user", "content": text})
                    ids = encode_chat(tokenizer, messages)
                    body = dict(request_body(ids, 0.0, 0, args.max_tokens, False), cache_prompt=True)
                    reply = alone(name, servers, lambda: complete(servers[name].url, body))
                    usage = reply.extra.get("usage") or {}
                    timings = reply.extra.get("timings") or {}
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                    if cached is None and timings:
                        cached = timings.get("cache_n")
                    rows.append({"session": s, "method": name, "turn": turn,
                                 "prompt_tokens": len(ids), "cached_tokens": cached,
                                 "completion_tokens": reply.completion_tokens,
                                 "wall_seconds": reply.wall_seconds})
                    print(f"session {s} {name} turn {turn}: {reply.wall_seconds:.2f} s, prompt "
                          f"{len(ids)} ({cached} cached), {reply.completion_tokens} tokens",
                          file=sys.stderr)
                    messages.append({"role": "assistant", "content": reply.text})
                rows.append({"session": s, "method": name, "turn": "all",
                             "wall_seconds": time.perf_counter() - start})
    finally:
        stop_servers(servers)
    totals = {}
    for r in rows:
        if r["turn"] == "all":
            totals.setdefault(r["method"], []).append(r["wall_seconds"])
    base = totals[methods[0].name]
    for name, walls in totals.items():
        ratios = [b / w for b, w in zip(base, walls)]
        print(f"{name}: sessions {', '.join(f'{w:.1f} s' for w in walls)}; x {methods[0].name} "
              f"{', '.join(f'{x:.2f}' for x in ratios)}")
    cpu = cpu_description()
    cpu.pop("flags")
    doc = {"cpu": cpu, "max_tokens": args.max_tokens, "methods": [m.name for m in methods],
           "rows": rows}
    label = f"-{args.label}" if args.label else ""
    out = Path(args.out_dir) / f"multi-turn{label}-{datetime.date.today().isoformat()}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
