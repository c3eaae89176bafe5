"""Where do the n-gram drafter's predictions miss? Its acceptance estimates replayed, key by key,
on every recorded target sample of a prompt set.

    python benchmarks/calibration_replay.py --prompt-set chat --temperature 0.6 \\
        benchmarks/results/*servers*.raw.json --out benchmarks/results/calibration-replay-chat-t0.6

A live server reports predicted against kept tokens per drafting step per request (`--json`,
`/metrics`), but on chat a request drafts about once, so one benchmark run holds a few tens of
steps and cannot tell a 10 % bias from noise. Every answer a server benchmark recorded from
plain llama-server or from redwood is a sample of the target at that temperature (redwood's
verifiers are exact; the bench asks every server for pure temperature sampling), and a sample
follows a point-mass draft exactly as often as the verifier would keep it. So this replays
redwood's n-gram drafter (as `serve` builds it: shipped calibration, pools by prompt kind,
learning, memory; this machine's first-use profile as its costs, no live costs) over each
recorded answer: one fresh drafter per (file, round, method), a fresh server's, answers in run
order. It reports:

- per node key (match bucket, depth, later sibling): the rate the drafter used for every node
  it proposed that verification would have tried, against how often the sample kept it;
- per drafted step, by the bucket of its first node: predicted tokens (E(n), bonus included)
  against tokens kept;
- the whole set's predicted / kept with a 95 % bootstrap interval over prompts (answers of one
  prompt resampled together: they share its matches).

The replay ignores live costs (a live server drafts less where steps cost more than the profile
said), so its step counts are not a server's; its calibration by key is what it is for.

Options: `--prompt-range 12:24` replays only those prompts of the set (chat's calibration
split); `--flat-costs` drafts as if every tree size cost one step, so every key is tried however
steep this machine is; `--taught-by humaneval` first replays that set's answers (uncounted) and
shares one acceptance model between every drafter, as a machine's learnt-rates file shares it
between servers; `--no-chat-pool` lets chat turns learn in the completions' pool, as before they
had one of their own (the A/B of it, docs/design.md §3.3).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# the methods whose answers are target samples (llama.cpp's own speculation is left out)
SAMPLE_METHODS = ("llama-server", "llama-server-2", "redwood", "redwood-ngram", "redwood-auto")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", nargs="+", help="server benchmarks' .raw.json files")
    parser.add_argument("--prompt-set", required=True)
    parser.add_argument("--temperature", type=float, required=True)
    parser.add_argument("--prompt-range", default=None, metavar="START:STOP",
                        help="only prompts START..STOP-1 of the set (e.g. 12:24, chat's "
                             "calibration split)")
    parser.add_argument("--taught-by", default=None, metavar="SET",
                        help="first replay SET's answers (same files and temperature, not "
                             "counted), and let every drafter share one acceptance model, as "
                             "a machine's learnt-rates file shares it between servers")
    parser.add_argument("--flat-costs", action="store_true",
                        help="draft as if every tree size cost one step (the whole useful trie "
                             "up to the budget, as `redwood calibrate --drafter ngram` does), "
                             "not on this machine's profile: every key is tried, however steep "
                             "this machine's costs")
    parser.add_argument("--no-chat-pool", action="store_true",
                        help="chat turns learn in the short prompts' pool with completions "
                             "(as before chat requests had a pool of their own): the A/B of it")
    parser.add_argument("--out", help="write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    start, stop = _prompt_range(parser, args.prompt_range)

    from copy_ceiling import _drafter, _machine, shipped_bundle

    from redwood.measure.ngram_calibration import acceptance_model
    from redwood.prompts import assistant_turn_ids

    profile, tokenizer, pair = _machine()
    chat_turn = () if args.no_chat_pool else assistant_turn_ids(tokenizer)
    shared = acceptance_model(shipped_bundle(), chat_turn=chat_turn) if args.taught_by else None

    def drafter():
        return _drafter(None if args.flat_costs else profile, chat_turn=chat_turn, model=shared)

    if args.taught_by:
        replay_set(args.raw, args.taught_by, args.temperature, (0, None), drafter, tokenizer,
                   pair, Tally())
    tally = Tally()
    answers = replay_set(args.raw, args.prompt_set, args.temperature, (start, stop), drafter,
                         tokenizer, pair, tally)
    if not answers:
        parser.error(f"no {args.prompt_set} answers at T {args.temperature:g} in the files given")
    report = tally.report(args.prompt_set, args.temperature, answers)
    report.update(taught_by=args.taught_by, prompt_range=args.prompt_range,
                  costs="flat" if args.flat_costs else "this machine's profile",
                  pools="no chat pool" if args.no_chat_pool else "chat pool")
    text = markdown(report)
    print(text)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(report, indent=1) + "\n")
        Path(args.out + ".md").write_text(text)
        print(f"wrote {args.out}.json and {args.out}.md")
    return 0


def _prompt_range(parser, text: str | None) -> tuple[int, int | None]:
    if text is None:
        return 0, None
    try:
        start, stop = (int(part) for part in text.split(":"))
    except ValueError:
        parser.error(f"--prompt-range wants START:STOP (two integers), not {text!r}")
    if not 0 <= start < stop:
        parser.error(f"--prompt-range {text}: needs 0 <= START < STOP")
    return start, stop


def replay_set(paths, prompt_set: str, temperature: float, prompt_range, new_drafter,
               tokenizer, pair, tally) -> int:
    """Replay every recorded answer of `prompt_set` at `temperature` (prompts within
    prompt_range, (start, stop or None)) in the files at `paths`: one new_drafter() per (file,
    round, method), answers in run order. Returns how many answers were replayed."""
    from copy_ceiling import _prompt_ids

    start, stop = prompt_range
    answers = 0
    for path in paths:
        records = [r for r in json.loads(Path(path).read_text())
                   if r["prompt_set"] == prompt_set and r["temperature"] == temperature
                   and r["method"] in SAMPLE_METHODS and r.get("text")
                   and start <= prompt_index(r["prompt"]) < (stop or 1 << 30)]
        if not records:
            continue
        ids = _prompt_ids(pair, records)
        for server in sorted({(r["round"], r["method"]) for r in records}):
            drafter = new_drafter()
            for r in records:
                if (r["round"], r["method"]) != server or (r["prompt_set"], r["prompt"]) not in ids:
                    continue
                answer = tokenizer.encode(r["text"], add_special_tokens=False)
                replay(drafter, ids[(r["prompt_set"], r["prompt"])], answer, temperature,
                       tally.for_prompt(r["prompt"]))
                answers += 1
    return answers


def prompt_index(name: str) -> int:
    """7 for "chat-7": a prompt's place in its set."""
    return int(name.rsplit("-", 1)[1])


class Tally:
    """Counts per prompt: nodes[key label] = [sum of rates used, kept, tried]; steps[first
    bucket] = [predicted tokens, kept tokens, steps]."""

    def __init__(self):
        self.prompts: dict[str, dict] = {}

    def for_prompt(self, prompt: str) -> dict:
        return self.prompts.setdefault(prompt, {"nodes": defaultdict(lambda: [0.0, 0, 0]),
                                                "steps": defaultdict(lambda: [0.0, 0, 0])})

    def total(self, part: str, prompts=None) -> dict[str, list]:
        out: dict[str, list] = defaultdict(lambda: [0.0, 0, 0])
        for name in prompts if prompts is not None else self.prompts:
            for label, row in self.prompts[name][part].items():
                out[label] = [a + b for a, b in zip(out[label], row)]
        return out

    def bias(self, prompts=None) -> float | None:
        """Predicted / kept tokens over the drafted steps of `prompts`, minus 1."""
        steps = self.total("steps", prompts).values()
        kept = sum(row[1] for row in steps)
        return sum(row[0] for row in steps) / kept - 1 if kept else None

    def report(self, prompt_set: str, temperature: float, answers: int,
               resamples: int = 2000, seed: int = 0) -> dict:
        rng, names = random.Random(seed), sorted(self.prompts)
        draws = sorted(b for b in (self.bias([rng.choice(names) for _ in names])
                                   for _ in range(resamples)) if b is not None)
        interval = [draws[int(0.025 * len(draws))], draws[int(0.975 * len(draws)) - 1]] \
            if draws else None
        return {"prompt_set": prompt_set, "temperature": temperature, "answers": answers,
                "bias": self.bias(), "bias_95": interval,
                "steps": sum(row[2] for row in self.total("steps").values()),
                "nodes": dict(self.total("nodes")), "by_first_bucket": dict(self.total("steps")),
                "by_prompt": {n: {"steps": sum(r[2] for r in self.total("steps", [n]).values()),
                                  "bias": self.bias([n])} for n in names}}


def replay(drafter, prompt: list[int], answer: list[int], temperature: float, tally: dict) -> None:
    """Decode `answer` under the drafter's own proposals (copy_ceiling.policy_replay's steps),
    counting into `tally` (Tally's for_prompt) every proposed node verification would try
    (children of the kept path, in rank order, up to the first one kept) and every drafted
    step's predicted and kept tokens."""
    from copy_ceiling import policy_replay

    from redwood.decode.ngram_acceptance import MATCH_LABELS, node_bucket

    greedy = temperature == 0

    def count(proposal, kept: list[int]) -> None:
        trie, proposed = drafter._last[0], set(drafter._proposed)
        _count_tried(drafter, trie, proposed, kept, greedy, tally, MATCH_LABELS)
        if proposed:
            first = min(proposed, key=lambda u: (trie[u].depth, trie[u].rank))
            row = tally["steps"][MATCH_LABELS[node_bucket(trie[first])]]
            row[0] += proposal.expected_tokens
            row[1] += len(kept) + 1
            row[2] += 1

    policy_replay(drafter, prompt, answer, None, temperature, on_step=count)


def _count_tried(drafter, trie, proposed: set, kept: list[int], greedy: bool, tally: dict,
                 labels) -> None:
    """Count each node verification tries along the kept path (every proposed child of a kept
    node up to the one kept, all of them below the last) with the rate the drafter estimates
    for its key (before the draft ratio scales whole drafts)."""
    node = 0
    for depth in range(len(kept) + 1):
        hit = None
        for child in (c for c in trie[node].children if c in proposed):
            key = drafter.model.key(greedy, trie[child])
            row = tally["nodes"][key_label(key, labels)]
            row[0] += drafter.estimates.rate(key)
            row[2] += 1
            if depth < len(kept) and trie[child].token == kept[depth]:
                row[1] += 1
                hit = child
                break
        if hit is None:
            return
        node = hit


def key_label(key: tuple, labels) -> str:
    """"8-15 d1", "near d2 r2+": a node key's bucket, depth (6 = 6+) and later-sibling flag."""
    return f"{labels[key[1]]} d{key[2] + 1}" + (" r2+" if key[3] else "")


def markdown(report: dict) -> str:
    head = f"{report['prompt_set']} at T {report['temperature']:g}: {report['answers']} recorded " \
           f"answers replayed, {report['steps']} drafted steps"
    if report["bias"] is not None:
        low, high = report["bias_95"]
        head += (f", predicted / kept tokens per drafted step {report['bias']:+.1%} "
                 f"(95 % over prompts {low:+.1%} .. {high:+.1%})")
    notes = [f"{name}: {report[name]}" for name in ("costs", "pools", "prompt_range", "taught_by")
             if report.get(name)]
    lines = [head + (f" ({'; '.join(notes)})" if notes else ""),
             "", "| node key | tried | rate used | kept |", "|---|---|---|---|"]
    for label, (rates, kept, tried) in sorted(report["nodes"].items(), key=lambda kv: -kv[1][2]):
        lines.append(f"| {label} | {tried} | {rates / tried:.3f} | {kept / tried:.3f} |")
    lines += ["", "| first node's bucket | drafted steps | predicted / step | kept / step | "
              "predicted / kept |", "|---|---|---|---|---|"]
    for label, (predicted, kept, steps) in sorted(report["by_first_bucket"].items(),
                                                   key=lambda kv: -kv[1][2]):
        lines.append(f"| {label} | {steps} | {predicted / steps:.2f} | {kept / steps:.2f} | "
                     f"{predicted / kept - 1:+.1%} |")
    lines += ["", "| prompt | drafted steps | predicted / kept |", "|---|---|---|"]
    for name, row in report["by_prompt"].items():
        bias = "" if row["bias"] is None else f"{row['bias']:+.1%}"
        lines.append(f"| {name} | {row['steps']} | {bias} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
