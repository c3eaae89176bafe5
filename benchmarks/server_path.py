"""Where a plain step's time goes in `redwood serve` as a client sees it: the batch scheduler's
step (benchmarks/plain_path.py --batched times that alone) plus what the server adds around it:
the worker's loop and metrics, detokenising, posting each step's text to the event loop, the
SSE chunks, the HTTP response.

    python benchmarks/server_path.py                                  # chat, T 0, default drafter
    python benchmarks/server_path.py --temperature 0.6 --prompts 3 --repeats 3
    python benchmarks/server_path.py --no-stream          # whole answers, as `redwood bench` asks

The server runs in this process (the default `serve` configuration: batched, prompt lookup,
prefix cache; its memory of earlier answers off unless --ngram-memory) under uvicorn on 127.0.0.1, with `llama_decode` timed;
the client runs in another process (the bench's HTTP client, streaming, as `redwood bench`
does), so it competes for the CPU as a real one does but not for this interpreter. Every
request asks for up to --tokens tokens (natural stop; the prompt cache off). For each request:

    steps   = its decodes after the one that finished its prompt (one token each: nothing drafts
              on most chat steps; a drafted step counts once)
    wall    = last byte read by the client - end of the prompt's decode
    outside = (wall - the steps' llama_decode time) / steps

so "outside" is everything a C++ server would not pay per step, the client's share of the CPU
included, and `decode_ms` shows whether work overlapping llama_decode slowed the decode itself
(compare plain_path.py --batched's). Target (issue: never slower than llama-server): outside <=
1.5 % of a plain step. Writes JSON under benchmarks/results/.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plain_path import TimedLlama, common_arguments, prompt_ids  # noqa: E402  (this folder)

CLIENT = """
import json, sys, time
from redwood.bench.http_client import complete
url, bodies = sys.argv[1], json.loads(sys.stdin.read())
for body in bodies:
    start = time.perf_counter()
    reply = complete(url, body)
    print(json.dumps({"start": start, "end": start + reply.wall_seconds,
                      "tokens": reply.completion_tokens}), flush=True)
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(parser)
    parser.add_argument("--drafter", default="auto", choices=("model", "ngram", "auto"))
    parser.add_argument("--prompt-set", default="chat", choices=("humaneval", "chat"))
    parser.add_argument("--ngram-memory", type=int, default=0, metavar="TOKENS",
                        help="the server's memory of earlier answers (serve's default: 32768); "
                             "0 here, so a repeated prompt decodes plain steps again instead of "
                             "copying its last answer")
    parser.add_argument("--stream-interval", type=float, default=None, metavar="SECONDS",
                        help="the server's --stream-interval (default: serve's)")
    parser.add_argument("--no-stream", action="store_true",
                        help="ask for whole answers (stream false), as `redwood bench` does: "
                             "no text is posted while the request runs")
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--label", default="", metavar="NAME",
                        help="put NAME in the result file's name (e.g. the machine: runs on two "
                             "CPUs the same day would otherwise share one file)")
    args = parser.parse_args(argv)
    rows = measure(args)
    write(args, rows)
    return 0


def measure(args) -> list[dict]:
    import uvicorn

    from redwood.serve.app import ServerConfig, create_app
    from redwood.serve.batch_setup import load_batch_scheduler

    scheduler, tokenizer = load_batch_scheduler(progress=False, drafter=args.drafter,
                                                ngram_memory=args.ngram_memory)
    backend = scheduler.target.backend
    log = backend._llama = TimedLlama(backend._llama)
    pace = {} if args.stream_interval is None else {"stream_interval": args.stream_interval}
    app = create_app(scheduler, tokenizer, ServerConfig(model_name="bench", port=0, **pace))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    prompts = [ids.tolist() for ids in prompt_ids(tokenizer, args)]
    order = [(r, i) for r in range(args.repeats) for i in range(len(prompts))]
    bodies = [body(prompts[0][:8], 0.0, 0, 4)] + [
        body(prompts[i], args.temperature, r, args.tokens, not args.no_stream) for r, i in order]
    try:
        out = subprocess.run([sys.executable, "-c", CLIENT, f"http://127.0.0.1:{port}"],
                             input=json.dumps(bodies), capture_output=True, text=True,
                             check=True).stdout
    finally:
        server.should_exit = True
        thread.join(30)
    replies = [json.loads(line) for line in out.splitlines()][1:]      # the warm-up dropped
    return [row(r, i, reply, log.spans, len(prompts[i]), scheduler.prefill_chunk)
            for (r, i), reply in zip(order, replies)]


def body(ids, temperature: float, seed: int, tokens: int, stream: bool = True) -> dict:
    from redwood.bench.server_bench import request_body

    return request_body(ids, temperature, seed, tokens, stream)


def row(repeat: int, prompt: int, reply: dict, spans: list, prompt_len: int,
        chunk: int) -> dict:
    mine = [s for s in spans if reply["start"] <= s[0] <= reply["end"]]
    prefill = -(-prompt_len // chunk)               # decodes that ran the prompt (cache off)
    steps = mine[prefill:]
    if not 1 <= len(steps) <= reply["tokens"] - 1:      # drafted steps: fewer than tokens
        raise RuntimeError(f"request {repeat}/{prompt}: {len(mine)} decodes for "
                           f"{reply['tokens']} tokens")
    wall = reply["end"] - mine[prefill - 1][1]
    decode = sum(end - start for start, end in steps)
    n = len(steps)
    r = {"repeat": repeat, "prompt": prompt, "steps": n, "tokens": reply["tokens"],
         "wall_ms": 1e3 * wall / n, "decode_ms": 1e3 * decode / n,
         "outside_ms": 1e3 * (wall - decode) / n, "load_average": os.getloadavg()[0]}
    print(f"repeat {repeat} prompt {prompt}: {r['tokens']} tokens in {n} steps, "
          f"{r['wall_ms']:.2f} ms/step, llama_decode {r['decode_ms']:.2f}, outside "
          f"{r['outside_ms']:.3f} ({100 * r['outside_ms'] / r['wall_ms']:.2f} %)",
          file=sys.stderr)
    return r


def write(args, rows: list) -> None:
    from redwood.bench.server_run import cpu_description

    share = [r["outside_ms"] / r["wall_ms"] for r in rows]
    doc = {"cpu": cpu_description(), "tokens": args.tokens, "drafter": args.drafter,
           "stream_interval": args.stream_interval, "stream": not args.no_stream,
           "prompt_set": args.prompt_set, "temperature": args.temperature, "rows": rows,
           "outside_share_median": statistics.median(share), "outside_share_max": max(share),
           "outside_ms_median": statistics.median(r["outside_ms"] for r in rows),
           "decode_ms_median": statistics.median(r["decode_ms"] for r in rows),
           "step_ms_median": statistics.median(r["wall_ms"] for r in rows)}
    doc["cpu"].pop("flags")
    mode = "-whole" if args.no_stream else ""
    label = f"{args.label}-" if args.label else ""
    out = Path(args.out_dir) / (f"server-path-{label}{args.drafter}{mode}-{args.prompt_set}-"
                                f"T{args.temperature:g}-{datetime.date.today().isoformat()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"outside llama_decode (server, {'whole answers' if args.no_stream else 'streamed'}, "
          f"client in another process): median "
          f"{100 * doc['outside_share_median']:.2f} % of a step ({doc['outside_ms_median']:.3f} "
          f"of {doc['step_ms_median']:.2f} ms; llama_decode {doc['decode_ms_median']:.2f} ms), "
          f"max {100 * doc['outside_share_max']:.2f} %; wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
