"""How fast could free drafts make each request on this machine, and how close does redwood get?

    python benchmarks/copy_ceiling.py benchmarks/results/cpu-2core-epyc-copy-2026-12-01.raw.json

Reads a server benchmark's raw records (`redwood bench --servers ...`) at one temperature
(`--temperature`, default 0): per prompt, plain llama-server's answer (greedy, or its sampled
answer at T > 0; its text, tokenised back to ids), its prompt time
(llama-server's `timings.prompt_ms`) and every method's end-to-end times. On this machine's
first-use profile (target t(n) at the request's context length where the profile has a table
by context, else its 128-token table) it replays:

- `ceiling`: an oracle that drafts exactly the tokens the target will say next: each step
  drafts a chain of n - 1 tokens, all accepted, and gains n tokens for t(n); the schedule that
  minimises the decode time of the whole answer (dynamic programming over measured sizes) is
  the machine's ceiling for that answer (no real drafter knows the future);
- `ngram policy`: redwood's n-gram drafter as it runs (its cost model, its calibrated priors,
  learning, and its memory of earlier answers in run order), proposing on the prompt and the
  answer so far; a step gains the longest proposed path the answer follows, plus the bonus
  token, and costs t(tree size); its predicted tokens per drafted step (E(n)) against the
  tokens kept there are the replay's check of the acceptance estimates' calibration;
- `copy ceiling`: an oracle limited to copying: each step may draft only a span that occurs
  verbatim in its sources (it knows which occurrence to take), on the prompt and the answer so
  far (`request`) and with the earlier answers of the run added (`with memory`); their ratio
  bounds what a memory of earlier answers can add to a copy drafter on that request;
- `request-only policy`: the same n-gram policy without the memory;
and reports, per prompt, each as an end-to-end speedup over plain decoding (prompt time + t(1)
per token), beside the measured speedup of each method (round 1: the memory-flattering later
rounds excluded) and the share of the ceiling's gain a method reached: (measured - 1) /
(ceiling - 1). The replay is a cost-model prediction: it ignores the time around the forwards
and assumes t(n) at the context it interpolates. Writes JSON + markdown next to the input
(`-ceiling`, or `-ceiling-t0.6` at T = 0.6).

At T > 0 every method samples its own answer: the oracles and the policy replay run on the
baseline's sample (a sample is as likely under a point-mass draft as the draft is to be kept,
so the replay's acceptance is unbiased; the policy drafts with its sampling keys), and a
method's measured speedup carries the baseline's time to the method's answer length at the
baseline's own decode cost per token, as the server benchmark's tables do
(bench.server_report.prompt_ratio), so a shorter sample does not pass for a faster method.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", help="a server benchmark's .raw.json")
    parser.add_argument("--baseline", default="llama-server")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="the records' temperature to replay (default 0: greedy)")
    args = parser.parse_args(argv)

    records = [r for r in json.loads(Path(args.raw).read_text())
               if r["temperature"] == args.temperature]
    if not records:
        parser.error(f"{args.raw} has no records at temperature {args.temperature:g}")
    profile, tokenizer, pair = _machine()
    prompts = _prompt_ids(pair, records)
    from redwood.prompts import assistant_turn_ids

    turn = assistant_turn_ids(tokenizer)
    drafter = _drafter(profile, chat_turn=turn)
    alone = _drafter(profile, memory=False, chat_turn=turn)
    earlier: list[list[int]] = []          # answers so far in run order (the memory's text)
    rows = []
    for (prompt_set, name), ids in prompts.items():
        base = _first(records, prompt_set, name, args.baseline)
        if base is None:
            continue
        answer = tokenizer.encode(base["text"], add_special_tokens=False)
        prompt_ms = (base.get("extra", {}).get("timings") or {}).get("prompt_ms") or 0.0
        costs = _costs_at(profile, len(ids) + len(answer) // 2)
        plain = prompt_ms + costs[1] * len(answer)
        ceiling = prompt_ms + oracle_ms(len(answer), costs)
        replayed = policy_replay(drafter, ids, answer, costs, args.temperature)
        policy = prompt_ms + replayed["ms"]
        request_only = prompt_ms + policy_replay(alone, ids, answer, costs,
                                                 args.temperature)["ms"]
        copy_request = prompt_ms + copy_oracle_ms([ids], answer, costs)
        copy_memory = prompt_ms + copy_oracle_ms([ids, *earlier], answer, costs)
        earlier.append(answer)
        row = {"set": prompt_set, "prompt": name, "prompt_tokens": len(ids),
               "answer_tokens": len(answer), "plain_ms": round(plain, 1),
               "ceiling": round(plain / ceiling, 3),
               "ngram_policy": round(plain / policy, 3),
               "request_only_policy": round(plain / request_only, 3),
               "copy_ceiling_request": round(plain / copy_request, 3),
               "copy_ceiling_memory": round(plain / copy_memory, 3),
               "policy_drafted_steps": replayed["steps"],
               "policy_predicted_tokens": round(replayed["predicted"], 2),
               "policy_kept_tokens": replayed["kept"]}
        for method in sorted({r["method"] for r in records} - {args.baseline}):
            mine = _first(records, prompt_set, name, method)
            if mine is not None:
                measured = measured_speedup(base, mine)
                row[method] = round(measured, 3)
                row[method + " share"] = round((measured - 1) / (row["ceiling"] - 1), 3) \
                    if row["ceiling"] > 1.001 else None
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    tail = f"-t{args.temperature:g}" if args.temperature else ""
    out = Path(args.raw.replace(".raw.json", f"-ceiling{tail}.json"))
    out.write_text(json.dumps({"profile": profile.to_dict(), "rows": rows}, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(rows))
    print(markdown(rows))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


def oracle_ms(tokens: int, costs: dict[int, float]) -> float:
    """Least decode time for `tokens` tokens when every drafted token is right: best[r] = min
    over measured n <= r of t(n) + best[r - n] (n tokens per step: n - 1 drafted + bonus)."""
    best = [0.0] + [float("inf")] * tokens
    sizes = sorted(costs)
    for r in range(1, tokens + 1):
        best[r] = min(costs[n] + best[r - n] for n in sizes if n <= r)
    return best[tokens]


def copy_oracle_ms(sources: list[list[int]], answer: list[int],
                   costs: dict[int, float]) -> float:
    """Least decode time of `answer` when a step may draft only a span found verbatim in the
    sources or in the answer before it: span[at] = the longest prefix of answer[at:] occurring
    there (brute force); best[at] = min over d <= span[at] of t(d + 1) + best[at + d + 1]."""
    from redwood.plan.live_costs import measured_ms

    longest = max(costs) - 1
    positions: dict[int, list[tuple[list[int], int]]] = {}
    for text in sources:
        for i, token in enumerate(text):
            positions.setdefault(token, []).append((text, i))
    span = []
    for at in range(len(answer)):
        best = 0
        for text, i in positions.get(answer[at], ()):
            end = at if text is answer else len(text)      # copy only what is already there
            k = 1
            while k < longest and i + k < end and at + k < len(answer) \
                    and text[i + k] == answer[at + k]:
                k += 1
            best = max(best, k)
        span.append(min(best, longest))
        positions.setdefault(answer[at], []).append((answer, at))
    time = [0.0] * (len(answer) + 1)
    for at in range(len(answer) - 1, -1, -1):
        reach = min(span[at], len(answer) - at - 1)
        time[at] = min(measured_ms(costs, d + 1) + time[at + d + 1] for d in range(reach + 1))
    return time[0]


def measured_speedup(base: dict, mine: dict) -> float:
    """The baseline's end-to-end time over the method's on one prompt (raw records), an answer
    of another length carried to the method's length at the baseline's decode cost per token
    (the server benchmark's rule, bench.server_report.prompt_ratio)."""
    from redwood.bench.server_bench import Record
    from redwood.bench.server_report import per_prompt, prompt_ratio

    def cell(record):
        return next(iter(per_prompt([Record(**record)]).values()))

    return prompt_ratio(cell(base), cell(mine), "min")


def policy_replay(drafter, prompt: list[int], answer: list[int], costs: dict[int, float] | None,
                  temperature: float = 0.0, on_step=None) -> dict:
    """Decode time of `answer` under the n-gram drafter's own choices (see the module doc):
    {"ms", and over the steps that drafted: "steps", "predicted" tokens (the drafter's E(n),
    bonus included), "kept" tokens}. temperature > 0: the drafter sizes its trees with its
    sampling keys, as it does serving a request at that temperature. costs None: no time is
    counted ("ms" 0). on_step(proposal, kept): called with each step's proposal and the drafted
    tokens the answer keeps from it, before the drafter commits them."""
    import torch

    from redwood.decode.drafter import ChildChooser
    from redwood.decode.layout import LayoutCache
    from redwood.decode.ngram_drafter import COPY_DEPTH
    from redwood.decode.ngram_trees import ngram_budget_tree
    from redwood.plan.live_costs import measured_ms

    layout = LayoutCache(torch.device("cpu"))(ngram_budget_tree(depth=COPY_DEPTH))
    choose = ChildChooser(greedy=True) if temperature == 0 else \
        ChildChooser(greedy=False, temperature=temperature)
    drafter.prefill(torch.tensor(prompt[:-1]))
    text, root, at, total = answer, prompt[-1], 0, 0.0
    drafted = {"steps": 0, "predicted": 0.0, "kept": 0}
    while at < len(text):
        proposal = drafter.propose(root, layout, choose)
        parents, tokens = proposal.layout.tree.parents, proposal.tokens.tolist()
        path = [0]
        while True:                          # follow the answer down the proposed tree
            kids = [u for u in range(len(parents)) if parents[u] == path[-1]]
            nxt = at + len(path) - 1
            match = [u for u in kids if nxt < len(text) and tokens[u] == text[nxt]]
            if not match:
                break
            path.append(match[0])
        if on_step is not None:
            on_step(proposal, [tokens[u] for u in path[1:]])
        drafter.commit(path, proposal.tokens)
        gained = len(path)                   # accepted drafts + the bonus token
        if len(tokens) > 1:
            drafted["steps"] += 1
            drafted["predicted"] += proposal.expected_tokens
            drafted["kept"] += gained
        total += measured_ms(costs, len(tokens)) if costs is not None else 0.0
        at += gained
        root = text[at - 1] if at - 1 < len(text) else root
    drafter.finish()
    return {"ms": total, **drafted}


def _costs_at(profile, context: int) -> dict[int, float]:
    at = getattr(profile, "target_ms_at", None)
    return dict(at(context)) if at is not None else dict(profile.target_ms)


def _first(records, prompt_set, name, method):
    """The method's round-1 record of the prompt (the fastest of round 1 if repeated)."""
    mine = [r for r in records if r["prompt_set"] == prompt_set and r["prompt"] == name
            and r["method"] == method]
    first = [r for r in mine if r["round"] == min(x["round"] for x in mine)] if mine else []
    return min(first, key=lambda r: r["wall_seconds"]) if first else None


def _machine():
    from redwood.bench.server_run import PromptEncoder
    from redwood.measure.machine_profile import machine_profile
    from redwood.models.runtime import load_models

    models = load_models("qwen2.5-coder", backend="llamacpp", progress=False)
    profile = machine_profile(models.target, models.draft, progress=True)
    return profile, models.tokenizer, PromptEncoder(models.tokenizer)


def _prompt_ids(pair, records) -> dict:
    from redwood.bench.prompt_sets import load_prompt_sets

    sets = sorted({r["prompt_set"] for r in records})
    count = max(int(r["prompt"].rsplit("-", 1)[1]) for r in records) + 1
    prompts, _ = load_prompt_sets(pair, sets, count)
    wanted = {(r["prompt_set"], r["prompt"]) for r in records}
    return {(p.prompt_set, p.name): p.ids.tolist() for p in prompts if (p.prompt_set, p.name) in wanted}


def _drafter(profile, memory: bool = True, chat_turn: tuple[int, ...] = (), model=None):
    """A fresh drafter as `serve` builds it; chat_turn: the ids opening the assistant's turn
    (chat requests' own pool); model: an acceptance model to share (None: a fresh one);
    profile None: flat costs (every tree size one step: the whole useful trie is drafted)."""
    from redwood.decode.ngram_drafter import COPY_DEPTH, NgramDrafter
    from redwood.decode.ngram_memory import NgramMemory
    from redwood.measure.ngram_calibration import acceptance_model

    target_ms, by_context = (profile.target_ms, profile.target_ms_by_context) \
        if profile is not None else (None, None)
    # as `serve --drafter ngram` builds it (cli/textgen.use_ngram_drafter), without live costs
    return NgramDrafter(target_ms=target_ms, target_ms_by_context=by_context,
                        model=model if model is not None else
                        acceptance_model(shipped_bundle(), chat_turn=chat_turn),
                        max_length=COPY_DEPTH,
                        memory=NgramMemory(max_tokens=32768) if memory else None)


def shipped_bundle():
    """The shipped pair's llama.cpp bundle (its n-gram calibration: the drafter's priors)."""
    from redwood.measure.bundles import find_bundle

    return find_bundle("auto", "qwen2.5-coder", "llamacpp")


def _total(rows: list[dict], speedup: str) -> float:
    """The set's total plain time over its total time under a replay (a speedup of the sum)."""
    return sum(r["plain_ms"] for r in rows) / sum(r["plain_ms"] / r[speedup] for r in rows)


def _summary(mine: list[dict], methods: list[str]) -> list[str]:
    """One set's medians over prompts, the memory's gain (copy oracle and policy) and the
    policy's calibration."""
    def median(key):
        return statistics.median(r[key] for r in mine)

    def gain(with_memory, alone):
        per_prompt = statistics.median(r[with_memory] / r[alone] for r in mine)
        return f"{per_prompt:.3f} ({_total(mine, with_memory) / _total(mine, alone):.3f} in total)"

    steps = sum(r["policy_drafted_steps"] for r in mine) or 1
    summary = [f"ceiling median {median('ceiling'):.2f}",
               f"copy ceiling request / with memory {median('copy_ceiling_request'):.2f} / "
               f"{median('copy_ceiling_memory'):.2f}",
               f"policy {median('ngram_policy'):.2f}",
               f"without memory {median('request_only_policy'):.2f}",
               "memory over the request's own text, per-prompt median: copy ceiling "
               + gain("copy_ceiling_memory", "copy_ceiling_request") + ", policy "
               + gain("ngram_policy", "request_only_policy"),
               f"policy predicted / kept tokens per drafted step "
               f"{sum(r['policy_predicted_tokens'] for r in mine) / steps:.2f} / "
               f"{sum(r['policy_kept_tokens'] for r in mine) / steps:.2f}"]
    for m in methods:
        shares = [r[m + " share"] for r in mine if r.get(m + " share") is not None]
        if shares:
            summary.append(f"{m} share median {statistics.median(shares):.0%}")
    return summary


def markdown(rows: list[dict]) -> str:
    # every measured method has a "<method> share" column (None where the ceiling is 1)
    methods = sorted({k[:-len(" share")] for r in rows for k in r if k.endswith(" share")})
    head = ["set", "prompt", "prompt / answer tokens", "ceiling",
            "copy ceiling: request / with memory", "ngram policy (replayed)",
            "without memory (replayed)"]
    lines = ["| " + " | ".join(head + [f"{m} (measured, share of ceiling)" for m in methods]) + " |",
             "|" + "---|" * (len(head) + len(methods))]
    for r in rows:
        cells = [r["set"], r["prompt"], f"{r['prompt_tokens']} / {r['answer_tokens']}",
                 f"{r['ceiling']:.2f}",
                 f"{r['copy_ceiling_request']:.2f} / {r['copy_ceiling_memory']:.2f}",
                 f"{r['ngram_policy']:.2f}", f"{r['request_only_policy']:.2f}"]
        for m in methods:
            share = r.get(m + " share")
            cells.append(f"{r[m]:.2f} ({share:.0%})" if m in r and share is not None
                         else (f"{r[m]:.2f}" if m in r else ""))
        lines.append("| " + " | ".join(cells) + " |")
    for prompt_set in sorted({r["set"] for r in rows}):
        mine = [r for r in rows if r["set"] == prompt_set]
        lines.append(f"\n{prompt_set}: " + ", ".join(_summary(mine, methods)))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
