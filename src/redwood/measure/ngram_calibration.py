"""Per-source calibration of the n-gram drafter (`redwood calibrate --drafter ngram`, and
`redwood tune --drafter ngram|hybrid|auto` into the bundle).

The n-gram drafter sizes its trees from c = P(node accepted | parent accepted, earlier siblings
rejected), kept per key (greedy?, match length, depth, rank) and learned online from priors
(decode/ngram_drafter.py). Calibration measures those rates on real text instead of guessing
them: the target decodes each prompt plainly at the temperature asked, and the text is replayed
through a fresh drafter that looks up the trie at every step and walks it along what the target
actually emitted. For a point mass x reached, P(accepted) = P(next token is x) (docs/design.md
§4.5), so walking the emitted text gives unbiased observations of every node reached, exactly
what speculative steps with the whole trie would have seen, without running any tree.

The result is the counts per key; `AcceptanceModel(calibration=...)` turns them into priors.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from redwood.decode.ngram_acceptance import NEAR_BUCKET, AcceptanceModel
from redwood.decode.ngram_drafter import COPY_DEPTH, NgramDrafter
from redwood.decode.ngram_trees import ngram_budget_tree, tree_limits
from redwood.errors import RedwoodError

FORMAT = 2
# Format 1 bucketed match lengths 1, 2, 3, 4+; format 2 splits 4+ into 4-7, 8-15, 16-31, 32+
# (decode/ngram_acceptance.match_bucket). A format-1 file still loads: its 4+ counts become the
# prior of each of the four longer buckets.
_FORMAT1_LONG = 3


@dataclass
class NgramCalibration:
    counts: dict[tuple, list[float]]          # AcceptanceModel key -> [accepted, trials]
    temperatures: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "kind": "ngram_acceptance", "temperatures": self.temperatures,
                "key": ["greedy", "match_bucket", "depth_bucket", "later_rank"],
                "counts": [[list(k), v] for k, v in sorted(self.counts.items())], **self.extra}

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path) -> "NgramCalibration":
        where = str(path)
        try:
            data = json.loads(Path(path).read_text())
            if data.get("kind") != "ngram_acceptance" or data.get("format") not in (1, FORMAT):
                raise ValueError(f"not an n-gram acceptance file of format 1 or {FORMAT}")
            counts = {}
            for key, (accepted, trials) in data["counts"]:
                greedy, match, depth, later = key
                if not 0 <= float(accepted) <= float(trials):
                    raise ValueError(f"accepted {accepted} outside [0, trials {trials}]")
                matches = [int(match)]
                if data["format"] == 1 and int(match) == _FORMAT1_LONG:
                    matches = list(range(_FORMAT1_LONG, NEAR_BUCKET))
                for bucket in matches:
                    counts[(bool(greedy), bucket, int(depth), bool(later))] = \
                        [float(accepted), float(trials)]
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise RedwoodError(f"{where}: cannot read n-gram acceptance ({exc}); run `redwood "
                               "calibrate --drafter ngram` again") from None
        extra = {k: v for k, v in data.items()
                 if k not in ("format", "kind", "temperatures", "key", "counts")}
        return cls(counts, [float(t) for t in data.get("temperatures", [])], extra)

    def merged(self, other: "NgramCalibration") -> "NgramCalibration":
        counts = {k: list(v) for k, v in self.counts.items()}
        for key, (accepted, trials) in other.counts.items():
            mine = counts.setdefault(key, [0.0, 0.0])
            mine[0] += accepted
            mine[1] += trials
        extra = {**self.extra, **other.extra}
        for key in ("tokens", "seconds"):                 # totals over both runs
            if key in self.extra and key in other.extra:
                extra[key] = self.extra[key] + other.extra[key]
        return NgramCalibration(counts, sorted(set(self.temperatures + other.temperatures)), extra)


def replay(prompt: list[int], emitted: list[int], greedy: bool,
           drafter: NgramDrafter | None = None) -> AcceptanceModel:
    """Observe the n-gram trie of every step along `emitted` (what the target decoded after
    `prompt`), as speculative steps proposing the whole trie would; returns the model."""
    drafter = drafter or NgramDrafter(target_ms=None, max_length=COPY_DEPTH)
    limits = tree_limits(ngram_budget_tree(depth=COPY_DEPTH))
    text = list(prompt) + list(emitted)
    drafter.prefill(torch.tensor(text[:len(prompt) - 1], dtype=torch.long))
    i = len(prompt) - 1                                  # index of the step's root
    while i < len(text) - 1:
        trie, _, _ = drafter.lookup(text[i], limits, greedy)
        at, j = 0, i + 1
        while j < len(text) - 1:                         # the last token stays a future root
            child = next((c for c in trie[at].children if trie[c].token == text[j]), None)
            if child is None:
                break
            at, j = child, j + 1
        drafter.commit_tokens(text[i + 1:j])
        i = j
    drafter.skip(text[i])                                # learn from the last trie
    return drafter.model


def edit_prompts(tokenizer, count: int) -> tuple[list[torch.Tensor], str]:
    """The calibration split's edit tasks (redwood.edit_tasks, problems 0-39), kinds in turn,
    chat-encoded: input-grounded text, where free drafts matter."""
    from redwood.edit_tasks import KINDS, edit_tasks
    from redwood.prompts import encode_prompt, has_chat_template

    per_kind = -(-count // len(KINDS))
    tasks = [t for group in zip(*(edit_tasks(k, per_kind, "calibration") for k in KINDS))
             for t in group][:count]
    chat = has_chat_template(tokenizer)
    ids = [encode_prompt(tokenizer, t.prompt, chat) for t in tasks]
    return ids, (f"{count} edit tasks of the HumanEval calibration split "
                 f"({', '.join(KINDS)} in turn{', chat template' if chat else ', raw text'})")


def calibrate_ngram(target, prompts: list[torch.Tensor], temperature: float,
                    max_new_tokens: int = 64, seed: int = 0, progress: bool = True,
                    dataset: str = "") -> NgramCalibration:
    """Decode each prompt plainly with `target` (a Backend or transformers model) at
    `temperature`, replay the text through the n-gram drafter, pool the counts."""
    from redwood.decode.engine import Engine

    engine = Engine(target, None, drafter=NgramDrafter())
    model = AcceptanceModel()                 # every prompt's replay counts into this one
    start, tokens = time.perf_counter(), 0
    for i, ids in enumerate(prompts):
        result = engine.generate(ids, max_new_tokens, temperature=temperature, seed=seed + i,
                                 method="autoregressive", stop_on_eos=True)
        replay(ids.tolist(), result.tokens, temperature == 0,
               NgramDrafter(target_ms=None, model=model, max_length=COPY_DEPTH))
        tokens += len(result.tokens)
        if progress:
            print(f"\rredwood: n-gram calibration T = {temperature:g}: prompt {i + 1}/"
                  f"{len(prompts)}", end="", flush=True, file=sys.stderr)
    if progress:
        print(file=sys.stderr)
    return NgramCalibration(model.counts, [float(temperature)],
                            {"dataset": dataset, "prompts": len(prompts), "tokens": tokens,
                             "max_new_tokens": max_new_tokens, "seed": seed,
                             "seconds": round(time.perf_counter() - start, 1)})


def acceptance_model(bundle=None, learned: bool = False,
                     chat_turn: tuple[int, ...] = ()) -> AcceptanceModel:
    """A fresh n-gram acceptance model: priors from the bundle's calibration when it has one.
    learned: with the rates earlier requests on this machine taught it, kept up to date as
    requests finish (measure/learned_rates.py; off where REDWOOD_LEARNED_RATES=0). Requests
    learn in one pool per kind of prompt (AcceptanceModel.pool_for); chat_turn: the ids that
    open the assistant's turn in the model's chat template (prompts.assistant_turn_ids), which
    tell a chat request's prompt from a raw completion's."""
    from redwood.measure.learned_rates import with_learned_rates

    path = getattr(bundle, "ngram_acceptance", None) if bundle is not None else None
    model = AcceptanceModel(calibration=NgramCalibration.load(path).counts if path else None,
                            by_prompt=True, chat_turn=chat_turn)
    return with_learned_rates(model, path) if learned else model
