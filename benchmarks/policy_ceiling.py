"""How fast can any drafting policy be, with this draft, on this machine? (greedy, T = 0)

    python benchmarks/policy_ceiling.py                        # shipped pair, humaneval + chat, 10 x 128
    python benchmarks/policy_ceiling.py --prompts 4 --max-new-tokens 64

Records, per prompt, the target's greedy continuation (redwood's `--grow` decoding, equal token
for token to autoregressive decoding), the draft's top-4 probabilities at every position of it
(one teacher-forced draft forward) and the target's prefill time. On that record and this
machine's first-use profile (target t(n) interpolated between measured sizes, extrapolated
along the last measured slope; the draft's per-level ms) it replays drafting policies and
totals their decode time:

- `assisted`: transformers' default assisted generation (draft up to 20 tokens, stop after one
  the draft gave q < 0.4; transformers only adapts that threshold when scikit-learn is
  installed, which it is not here);
- `chain tau/maxd/sib`: a chain that stops after a token of q < tau, at most maxd levels, with
  the rank-2 draft token as an extra leaf at every level whose rank-1 q < sib (sib 0: none);
  the best of a grid is reported;
- `oracle chain`: drafts exactly the tokens the target will keep, no more (the best any chain
  policy can do with this draft: a real one cannot know where the draft goes wrong);
- `oracle top-2`: the same through the draft's two best tokens, paying only for the right one
  (a loose bound for trees: a real tree pays for the wrong siblings too).

A chain that drafts past a wrong token goes on along the draft's own (unrecorded) path; it is
charged 0.5 + 0.25 + ... further levels up to its limit, as a chain that stops at the next
hesitation would be. Ratios: the assisted chain's time over the policy's, decode only (pooled
over prompts) and end to end (per prompt, the measured prefill added to both; median and worst).
These are predictions of the cost model, not timings: the real bench (redwood bench) measured
transformers' assisted generation at 9.6 tokens per target forward on HumanEval where this
replay predicts 8.1-8.8 (its `assisted` row), so read the ratios between policies, not as
speeds. Writes JSON + markdown under benchmarks/results/.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
GRID = {"tau": (0.1, 0.2, 0.3, 0.4, 0.6), "maxd": (8, 12, 16, 20, 24, 31), "sib": (0, 0.5, 0.7, 0.9)}


class Costs:
    """Target and draft ms from a Profile: t(n) linear between measured sizes and along the
    last measured slope beyond them (optimistic for deep policies); a draft level of width w."""

    def __init__(self, profile):
        self.target = dict(sorted(profile.target_ms.items()))
        self.level = {w: profile.draft_level_ms(w) or profile.draft_ms[max(profile.draft_ms)]
                      for w in (1, 2)}

    def target_ms(self, n: float) -> float:
        from redwood.decode.tree_growth import interpolated_ms

        a, b = list(self.target)[-2:]
        if n <= b:                          # the growth rule's own interpolation
            return interpolated_ms(self.target, n)
        return self.target[b] + (self.target[b] - self.target[a]) / (b - a) * (n - b)


def chain(rec, i, costs, tau, maxd, sib):
    """(tokens, ms) of one step from position i (see the module doc)."""
    gen, ids, q = rec["gen"], rec["q_ids"], rec["q"]
    levels = nodes = accepted = 0
    right, j = True, i
    while levels < maxd and j < len(gen):
        levels += 1
        nodes += 1 + (q[j][0] < sib)
        if right:
            if ids[j][0] == gen[j]:
                accepted += 1
            else:
                right = False
                accepted += q[j][0] < sib and ids[j][1] == gen[j]
        if q[j][0] < tau:
            break
        if not right:            # the draft goes on along its own wrong token: unrecorded
            extra = sum(0.5 ** k for k in range(1, maxd - levels + 1))
            levels, nodes = levels + extra, nodes + extra * (1 + (sib > 0) / 2)
            break
        j += 1
    width = 2 if sib else 1
    return accepted + 1, costs.target_ms(1 + nodes) + levels * costs.level[width]


def oracle(rec, i, costs, top):
    """(tokens, ms): draft exactly the run of positions where the target's token is among the
    draft's `top` best, paying one node and one width-1 level per kept token."""
    gen, ids = rec["gen"], rec["q_ids"]
    j = i
    while j < len(gen) and gen[j] in ids[j][:top]:
        j += 1
    levels = j - i
    if levels == 0:
        return 1, costs.target_ms(1)
    return levels + 1, costs.target_ms(levels + 1) + levels * costs.level[1]


def decode_ms(rec, step) -> float:
    i = total = 0
    while i < len(rec["gen"]):
        tokens, ms = step(rec, i)
        i, total = i + tokens, total + ms
    return total


def replay(records, costs) -> dict:
    """{policy name: {"ms": [per prompt], "tokens_per_step"}}."""
    def run(name, step):
        steps = []
        def counted(rec, i):
            out = step(rec, i)
            steps.append(out[0])
            return out
        ms = [decode_ms(rec, counted) for rec in records]
        return name, {"ms": ms, "tokens_per_step": sum(steps) / len(steps)}

    out = dict([run("assisted", lambda r, i: chain(r, i, costs, 0.4, 20, 0)),
                run("oracle chain", lambda r, i: oracle(r, i, costs, 1)),
                run("oracle top-2", lambda r, i: oracle(r, i, costs, 2))])
    grid = {}
    for tau in GRID["tau"]:
        for maxd in GRID["maxd"]:
            for sib in GRID["sib"]:
                name, res = run(f"chain tau={tau} maxd={maxd} sib={sib}",
                                lambda r, i, a=tau, b=maxd, c=sib: chain(r, i, costs, a, b, c))
                grid[name] = res
    best = min(grid, key=lambda k: sum(grid[k]["ms"]))
    out["best chain + siblings: " + best.removeprefix("chain ")] = grid[best]
    return out


def ratios(policies: dict, prefill_ms: list[float]) -> dict:
    """Per policy: × assisted decode-only (pooled) and end to end (median, worst prompt)."""
    base = policies["assisted"]["ms"]
    rows = {}
    for name, res in policies.items():
        e2e = [(p + b) / (p + m) for p, b, m in zip(prefill_ms, base, res["ms"])]
        rows[name] = {"tokens_per_step": round(res["tokens_per_step"], 2),
                      "decode_x_assisted": round(sum(base) / sum(res["ms"]), 3),
                      "e2e_x_assisted_median": round(statistics.median(e2e), 3),
                      "e2e_x_assisted_worst": round(min(e2e), 3)}
    return rows


def record_prompts(engine, prompts, max_new_tokens: int) -> list[dict]:
    """Greedy continuation, draft top-4 along it, target prefill ms, per prompt."""
    import torch

    target, draft = engine.target_backend.model, engine.draft_backend.model
    records = []
    for k, prompt in enumerate(prompts):
        ids = torch.as_tensor(prompt.ids).view(-1)
        result = engine.generate(ids, max_new_tokens=max_new_tokens, temperature=0.0)
        full = torch.cat([ids, torch.tensor(result.tokens)]).view(1, -1)
        with torch.inference_mode():
            start = time.perf_counter()
            target(ids.view(1, -1))
            prefill_ms = (time.perf_counter() - start) * 1e3
            q = draft(full).logits[0, ids.numel() - 1:-1].float().softmax(-1)
        top_q, top_ids = q.topk(4, -1)
        records.append({"set": prompt.prompt_set, "name": prompt.name, "prompt_tokens": ids.numel(),
                        "gen": list(result.tokens), "q_ids": top_ids.tolist(),
                        "q": top_q.tolist(), "prefill_ms": prefill_ms})
        print(f"  {prompt.name}: {ids.numel()} prompt tokens, prefill {prefill_ms:.0f} ms, "
              f"{len(result.tokens)} tokens ({k + 1}/{len(prompts)})", file=sys.stderr, flush=True)
    return records


def load(sets, count):
    """(engine, prompts): the shipped pair on transformers with this machine's kernels and
    first-use profile, as `redwood generate --grow` loads it."""
    from redwood.bench.prompt_sets import load_prompt_sets
    from redwood.cli.textgen import ModelConfig, load_engine
    from redwood.prompts import encode_prompt

    engine, tokenizer = load_engine(ModelConfig(backend="hf", grow=True), progress=True)

    class Encoder:
        def __init__(self):
            self.tokenizer = tokenizer

        def encode(self, texts):
            return [encode_prompt(tokenizer, t) for t in texts]

    return engine, load_prompt_sets(Encoder(), sets, count)[0]


def markdown(doc) -> str:
    lines = [f"# Drafting policies replayed on this machine's costs ({doc['date']})", "",
             f"- command: `{doc['command']}`", f"- cpu: {doc['cpu']}",
             f"- costs: t_target(1) = {doc['costs']['target_ms']['1']:.0f} ms, "
             f"t_target(32) = {doc['costs']['target_ms']['32']:.0f} ms, draft level "
             f"{doc['costs']['draft_level_ms']['1']:.1f} ms (width 2: "
             f"{doc['costs']['draft_level_ms']['2']:.1f} ms)", "",
             "Predictions of the cost model on recorded greedy runs (see the script's doc), "
             "not timings; × assisted = transformers' default assisted schedule replayed on "
             "the same record and costs.", ""]
    for name, rows in doc["sets"].items():
        lines += [f"## {name}", "", "| policy | tokens/step | × assisted, decode | "
                  "× assisted, end to end median (worst) |", "|---|---|---|---|"]
        lines += [f"| {k} | {r['tokens_per_step']:.2f} | {r['decode_x_assisted']:.3f} | "
                  f"{r['e2e_x_assisted_median']:.3f} ({r['e2e_x_assisted_worst']:.3f}) |"
                  for k, r in rows.items()]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> None:
    from redwood.measure.machine_profile import cpu_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt-set", nargs="+", default=["humaneval", "chat"])
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--machine", default="cpu-2core")
    args = ap.parse_args(argv)
    engine, prompts = load(args.prompt_set, args.prompts)
    costs = Costs(engine.profile)
    records = record_prompts(engine, prompts, args.max_new_tokens)
    doc = {"kind": "policy_ceiling", "date": datetime.date.today().isoformat(),
           "command": "python benchmarks/policy_ceiling.py " + " ".join(sys.argv[1:]),
           "cpu": cpu_model(), "grid": GRID,
           "costs": {"target_ms": {str(k): v for k, v in costs.target.items()},
                     "draft_level_ms": {str(k): v for k, v in costs.level.items()}},
           "sets": {}, "records": records}
    for name in args.prompt_set:
        mine = [r for r in records if r["set"] == name]
        doc["sets"][name] = ratios(replay(mine, costs), [r["prefill_ms"] for r in mine])
    stem = RESULTS / f"policy-ceiling-{args.machine}-{doc['date']}"
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    stem.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))
    print(f"wrote {stem}.json / .md", file=sys.stderr)


if __name__ == "__main__":
    main()
