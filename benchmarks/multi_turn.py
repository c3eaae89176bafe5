"""Multi-turn sessions and shared-prefix bursts through one HTTP client: what a chat UI or a coding
agent sends (the whole conversation every turn), with each server's prompt cache on (its default).

    python benchmarks/multi_turn.py --label defaults --methods llama-server redwood
    python benchmarks/multi_turn.py --label chat-rounds --workloads chat --sessions 5 --rounds 3 \
        --methods llama-server llama-server-again redwood
    python benchmarks/multi_turn.py --label ngram --workloads coding \\
        --methods llama-server-spec-default redwood-ngram

Workloads (`--workloads`, all by default):
- coding: a module pasted (redwood.edit_tasks' whole-file tasks), an edit that returns the whole
  module, two follow-up edits on the answer, then tests for it (4 turns);
- chat: a general-chat request (redwood.chat_prompts) and three follow-ups (4 turns);
- burst: 8 independent requests sharing one ~800-token system prompt, one after another and
  then all at once (a second system prompt for the concurrent run, so neither finds the other's
  prefix cached).
Every prompt is the chat template over the conversation so far, as token ids, sent streamed to
/v1/completions (greedy, natural stop, `cache_prompt` left on), so every server gets the same ids.
Sessions alternate which server goes first; idle servers are paused while one answers. With
`--rounds N` every round starts every server afresh (empty prompt caches, no memory of the last
round's answers, one untimed warm-up request each), so a round repeats the same work and the
summary can give each session's median and best time over rounds beside the per-round ratios.
Prints per turn wall time, time to first token and the cached tokens each server reports, per
session totals and ratios to the first method; writes JSON under benchmarks/results/.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

CODING_FOLLOW_UPS = (
    "Now add a one-line comment above every function saying what it returns. Return the whole "
    "module.",
    "Now rename the parameter `l` to `values` wherever it appears. Return the whole module.",
    "Now write pytest tests for every function of the module.")
CHAT_FOLLOW_UPS = ("Thanks. Now say the same in half as many words.",
                   "Give one concrete example of that.",
                   "Summarise our whole conversation in three bullet points.")
BURST_QUESTIONS = ("Which function here is the slowest, and why?", "Name one edge case of the "
                   "first function.", "Which names would you change?", "Is any function "
                   "recursive?", "What does the last function return for an empty input?",
                   "Suggest one docstring.", "Which function could use a type hint most?",
                   "Is there dead code?")
WORKLOADS = ("coding", "chat", "burst")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2, help="sessions per workload")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeats of every session, each on freshly started servers")
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--methods", nargs="+", default=["llama-server", "redwood"])
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--label", default="", help="part of the output file's name")
    parser.add_argument("--summarise", metavar="JSON",
                        help="summarise an earlier run's file again (after the summary changed) "
                             "and rewrite it; nothing is timed")
    args = parser.parse_args(argv)
    if args.summarise:
        doc = json.loads(Path(args.summarise).read_text())
        doc["summary"] = summarise(doc["rows"], doc["methods"])
        Path(args.summarise).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"rewrote {args.summarise}")
        return 0

    from redwood.bench.server_bench import start_servers, stop_servers
    from redwood.bench.server_run import cpu_description, find_llama_server, server_setup
    from redwood.bench.server_specs import check_methods

    setup, tokenizer = server_setup(find_llama_server(None), None, None)
    specs = check_methods(args.methods)
    methods = [m.name for m in specs]
    rows = []
    for r in range(args.rounds):
        servers = start_servers(specs, setup, Path(args.out_dir) / "server-logs")
        try:
            warm_up(servers)
            for workload in args.workloads:
                for s in range(args.sessions if workload != "burst" else 1):
                    shift = (s + r) % len(methods)
                    for name in methods[shift:] + methods[:shift]:
                        run = burst if workload == "burst" else session
                        rows += [dict(row, round=r) for row in
                                 run(workload, s, name, servers, tokenizer, args.max_tokens)]
        finally:
            stop_servers(servers)
    summary = summarise(rows, methods)
    cpu = cpu_description()
    doc = {"cpu": cpu, "max_tokens": args.max_tokens, "rounds": args.rounds, "methods": methods,
           "workloads": args.workloads, "summary": summary, "rows": rows}
    label = f"-{args.label}" if args.label else ""
    out = Path(args.out_dir) / f"multi-turn{label}-{datetime.date.today().isoformat()}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


def warm_up(servers) -> None:
    """One short untimed request per freshly started server: the first decode after a load
    pays page faults and allocations no later request does."""
    from redwood.bench.http_client import complete
    from redwood.bench.server_bench import request_body

    for server in servers.values():
        complete(server.url, request_body([1, 2, 3, 4, 5, 6, 7, 8], 0.0, 0, 4, False))


def digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def body_for(ids, max_tokens: int) -> dict:
    from redwood.bench.server_bench import request_body

    return dict(request_body(ids, 0.0, 0, max_tokens, True), cache_prompt=True)


def ask(name, servers, ids, max_tokens):
    from redwood.bench.http_client import complete

    reply = complete(servers[name].url, body_for(ids, max_tokens))
    return reply, cached_tokens(reply)


def cached_tokens(reply):
    """Prompt tokens the server says it reused (usage's cached_tokens, llama-server's cache_n)."""
    usage = reply.extra.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = (reply.extra.get("timings") or {}).get("cache_n")
    return cached


def session(workload, s, name, servers, tokenizer, max_tokens) -> list[dict]:
    """One multi-turn conversation on one server (the others paused)."""
    from redwood.bench.server_bench import alone
    from redwood.prompts import encode_chat

    turns = session_turns(workload, s)
    rows, messages, start = [], [], time.perf_counter()
    for turn, text in enumerate(turns):
        messages.append({"role": "user", "content": text})
        ids = encode_chat(tokenizer, messages)
        reply, cached = alone(name, servers, lambda: ask(name, servers, ids, max_tokens))
        rows.append({"workload": workload, "session": s, "method": name, "turn": turn,
                     "prompt_tokens": len(ids), "cached_tokens": cached,
                     "completion_tokens": reply.completion_tokens, "answer": digest(reply.text),
                     "wall_seconds": reply.wall_seconds, "ttft_seconds": reply.ttft_seconds})
        print(f"{workload} {s} {name} turn {turn}: {reply.wall_seconds:.2f} s (first token "
              f"{reply.ttft_seconds or 0:.2f} s), prompt {len(ids)} ({cached} cached), "
              f"{reply.completion_tokens} tokens", file=sys.stderr)
        messages.append({"role": "assistant", "content": reply.text})
    rows.append({"workload": workload, "session": s, "method": name, "turn": "all",
                 "wall_seconds": time.perf_counter() - start})
    return rows


def session_turns(workload: str, s: int) -> tuple[str, ...]:
    if workload == "coding":
        from redwood.edit_tasks import edit_tasks

        return (edit_tasks("whole_file", s + 1)[s].prompt,) + CODING_FOLLOW_UPS
    from redwood.chat_prompts import CHAT_PROMPTS

    return (CHAT_PROMPTS[s % len(CHAT_PROMPTS)][1],) + CHAT_FOLLOW_UPS


def system_prompt(index: int) -> str:
    """~800 tokens: instructions and two modules of the whole-file edit tasks."""
    from redwood.edit_tasks import edit_tasks

    tasks = edit_tasks("whole_file", 2 * index + 2)[2 * index:]
    code = "\n\n".join(t.prompt.split("```")[1] for t in tasks if "```" in t.prompt)
    return ("You are a careful senior Python reviewer. Answer briefly and precisely, quoting "
            "names from the project below when useful.\n\nThe project:\n```" + code + "```")


def burst(workload, s, name, servers, tokenizer, max_tokens) -> list[dict]:
    """8 requests sharing a system prompt: one after another, then all at once."""
    from redwood.bench.server_bench import alone
    from redwood.prompts import encode_chat

    rows = []
    for mode, index in (("sequential", 0), ("concurrent", 1)):
        system = system_prompt(index)
        prompts = [encode_chat(tokenizer, [{"role": "system", "content": system},
                                           {"role": "user", "content": q}])
                   for q in BURST_QUESTIONS]

        def run():
            if mode == "sequential":
                return [ask(name, servers, ids, max_tokens) for ids in prompts]
            with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
                return list(pool.map(lambda ids: ask(name, servers, ids, max_tokens), prompts))

        start = time.perf_counter()
        replies = alone(name, servers, run)
        wall = time.perf_counter() - start
        for i, (reply, cached) in enumerate(replies):
            rows.append({"workload": "burst", "session": mode, "method": name, "turn": i,
                         "prompt_tokens": len(prompts[i]), "cached_tokens": cached,
                         "completion_tokens": reply.completion_tokens,
                         "answer": digest(reply.text),
                         "wall_seconds": reply.wall_seconds, "ttft_seconds": reply.ttft_seconds})
        rows.append({"workload": "burst", "session": mode, "method": name, "turn": "all",
                     "wall_seconds": wall})
        print(f"burst {mode} {name}: {wall:.1f} s, prompts {len(prompts[0])} tokens, cached "
              f"{[c for _, c in replies]}", file=sys.stderr)
    return rows


def summarise(rows: list[dict], methods: list[str]) -> dict:
    """Per workload and session, each method's session time (median and best over rounds) and
    its speed against the first method's (> 1: faster): the median and the worst of the
    per-round ratios, and best time against best time; the same with the first method's time
    carried to the method's answer length (carried_seconds); TTFT on turns >= 2 (second turn
    on) as the first method's ÷ the method's; answers equal to the first method's in the same round."""
    base, summary = methods[0], {}
    keys = sorted({(r["workload"], str(r["session"])) for r in rows})
    for workload, s in keys:
        mine = [r for r in rows if r["workload"] == workload and str(r["session"]) == s]
        entry = {}
        for m in methods:
            entry_m = method_summary(mine, m, base)
            if entry_m is None:
                continue
            entry[m] = entry_m
            print(f"{workload} {s} {m}: median {entry_m['seconds']:.1f} s, best "
                  f"{entry_m['best_seconds']:.1f} s; x{entry_m['speed_vs_base']:.2f} vs {base} "
                  f"(worst round x{entry_m['worst_round_speed_vs_base']:.2f}, best of rounds "
                  f"x{entry_m['best_speed_vs_base']:.2f}; at the same answer length "
                  f"x{entry_m['same_length_speed_vs_base']:.2f}, worst round "
                  f"x{entry_m['same_length_worst_round']:.2f}); first token (turns 2+) median "
                  f"{entry_m['ttft_turns_2_on_median_s']} s; answers equal to {base}'s "
                  f"{entry_m['answers_equal']}")
        summary[f"{workload}/{s}"] = entry
    return summary


def method_summary(rows: list[dict], m: str, base: str) -> dict | None:
    def totals(name):
        return {r.get("round", 0): r["wall_seconds"] for r in rows
                if r["method"] == name and r["turn"] == "all"}

    def turns(name):
        return {(r.get("round", 0), r["turn"]): r for r in rows
                if r["method"] == name and r["turn"] != "all"}

    mine, theirs = totals(m), totals(base)
    if not mine:
        return None
    ratios = [theirs[r] / mine[r] for r in mine if r in theirs]
    my_turns, their_turns = turns(m), turns(base)
    same_length = [carried_seconds(their_turns, my_turns, r, theirs[r]) / mine[r]
                   for r in mine if r in theirs]
    ttft = [(their_turns[k]["ttft_seconds"], row["ttft_seconds"]) for k, row in my_turns.items()
            if isinstance(k[1], int) and k[1] >= 1 and k in their_turns
            and row["ttft_seconds"] and their_turns[k]["ttft_seconds"]]
    compared = [k for k in my_turns if k in their_turns and "answer" in my_turns[k]]
    equal = sum(my_turns[k]["answer"] == their_turns[k].get("answer") for k in compared)
    return {"seconds": round(statistics.median(mine.values()), 2),
            "best_seconds": round(min(mine.values()), 2),
            "rounds_seconds": [round(mine[r], 2) for r in sorted(mine)],
            "speed_vs_base": round(statistics.median(ratios), 3),
            "worst_round_speed_vs_base": round(min(ratios), 3),
            "best_speed_vs_base": round(min(theirs.values()) / min(mine.values()), 3),
            "same_length_speed_vs_base": round(statistics.median(same_length), 3),
            "same_length_worst_round": round(min(same_length), 3),
            "ttft_turns_2_on_median_s": round(statistics.median(t for _, t in ttft), 3)
            if ttft else None,
            "ttft_speed_vs_base": round(statistics.median(b / t for b, t in ttft), 3)
            if ttft else None,
            "answers_equal": f"{equal}/{len(compared)}"}


def carried_seconds(base_turns: dict, my_turns: dict, round_: int, base_seconds: float) -> float:
    """The baseline's session time in `round_` carried to the method's answer length: plus
    (the method's generated tokens - the baseline's) x the baseline's own decode time per
    token in that session (its turns' time after the first token over their tokens after the
    first), the server benchmark's rule (bench.server_report.prompt_ratio), so a session whose
    greedy near-ties led to longer answers is compared on the same work."""
    def of(turns):
        return [row for (r, _), row in turns.items() if r == round_]

    base, mine = of(base_turns), of(my_turns)
    decoding = [(row["wall_seconds"] - row["ttft_seconds"], row["completion_tokens"] - 1)
                for row in base if row.get("ttft_seconds") and (row.get("completion_tokens") or 0) > 1]
    seconds, tokens = sum(d for d, _ in decoding), sum(n for _, n in decoding)
    if not tokens:
        return base_seconds
    extra = sum(r.get("completion_tokens") or 0 for r in mine) - \
        sum(r.get("completion_tokens") or 0 for r in base)
    return max(base_seconds + extra * seconds / tokens, 1e-9)


if __name__ == "__main__":
    sys.exit(main())
