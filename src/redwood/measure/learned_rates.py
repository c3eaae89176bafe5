"""The n-gram acceptance model's learnt rates, kept on this machine between processes.

The n-gram drafter's pooled acceptance model starts every process from the bundle's priors,
calibrated on a mix of edits, HumanEval and chat, where a short match where the copy resumes
("near") or an answer repeating itself ("self-8+") goes on more often than in chat alone
(replayed on greedy chat answers, a 2-core EPYC: near depth-1 nodes were estimated 0.87 when
drafted and kept 0.74 over all of chat's observations). The model learns that within tens of
observations, but the drafted steps fall mostly before it has: every `redwood generate` call,
and every server's first requests, drafted on the optimistic prior and predicted 17-22 % more
tokens per drafted step than they kept (chat, T 0). Replaying the last five of ten chat and
HumanEval prompts with a model warmed on the first five brought that to +5 % (chat) and -12 %
(HumanEval), and the worst chat prompt's decode speed under the cost model from 0.92x to 0.99x
plain (docs/design.md §3.3).

So the learnt counts (per key, and the whole-draft ratios) persist, per bundle calibration,
under `$REDWOOD_CACHE/acceptance/`: loaded when a CLI or server process builds its model,
saved when a request finishes. They stay adaptive: each key keeps at most MAX_TRIALS trials
(MAX_DRAFT_TOKENS predicted tokens for a draft ratio), older evidence scaled down to make room,
so a machine that moves from chat to edits relearns within a few requests. A model pooling
requests by prompt kind (decode/ngram_acceptance.py, PROMPT_KINDS: short raw completions,
long prompts, short chat turns) keeps each kind's counts apart in the file, under "kinds"; the
file's name changes with the number of kinds, so a file of fewer kinds is left unread and
rebuilt. Processes sharing a
file each save what they know (last writer wins, under a file lock; nothing is half-written).
`REDWOOD_LEARNED_RATES=0` turns it off (the test suite does, for repeatable runs). Drafter-side
only: what is proposed changes, never how it is verified, so exactness is untouched.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from redwood.decode.ngram_acceptance import (DEPTH_BUCKETS, LONG_PROMPT, MATCH_BUCKETS,
                                             PROMPT_KINDS, AcceptanceModel)

FORMAT = 2             # 2: the pools by prompt kind (1: one pool)
MAX_TRIALS = 128.0
MAX_DRAFT_TOKENS = 256.0
ENV = "REDWOOD_LEARNED_RATES"


def learning_kept() -> bool:
    """Whether learnt rates are kept between processes here (REDWOOD_LEARNED_RATES not 0)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def learned_rates_path(calibration_file=None, cache_dir=None) -> Path | None:
    """Where the rates learnt over the priors of `calibration_file` (a bundle's n-gram
    calibration, or None: the built-in priors) live; None when REDWOOD_LEARNED_RATES=0."""
    from redwood.cache_dirs import cache_root
    from redwood.measure.machine_profile import key_digest

    if not learning_kept():
        return None
    priors = hashlib.sha256(Path(calibration_file).read_bytes()).hexdigest() \
        if calibration_file else "built-in"
    key = {"format": FORMAT, "match_buckets": MATCH_BUCKETS, "depth_buckets": DEPTH_BUCKETS,
           "prompt_kinds": [LONG_PROMPT, len(PROMPT_KINDS)], "priors": priors}
    return cache_root(cache_dir) / "acceptance" / f"rates-{key_digest(key)}.json"


def load_learned(model: AcceptanceModel, path: Path) -> bool:
    """Add the counts saved at `path` to `model` (a fresh one; with by_prompt, to its pools by
    prompt kind too). Returns whether any loaded; a missing file loads nothing, a damaged one
    is reported on stderr and ignored."""
    try:
        data = json.loads(Path(path).read_text())
        if data.get("format") != FORMAT:
            return False
        own = _counts(data)
        kinds = {int(kind): _counts(part) for kind, part in data.get("kinds", {}).items()}
        if any(kind not in range(len(PROMPT_KINDS)) for kind in kinds):
            raise ValueError(f"prompt kinds {sorted(kinds)} are not {list(PROMPT_KINDS)}")
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        print(f"redwood: ignoring damaged learnt n-gram rates {path} ({error}); "
              "they are rebuilt as requests finish", file=sys.stderr)
        return False
    loaded = _add(model, *own)
    for kind, (counts, drafts) in kinds.items():
        if model.by_prompt:               # a one-pool model reads its own counts only
            loaded |= _add(model.kind_pool(kind), counts, drafts)
    return loaded


def save_learned(model: AcceptanceModel, path: Path) -> None:
    """Write the model's counts to `path` atomically, each key capped (module doc)."""
    from filelock import FileLock

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the process goes on from the capped counts too, so it stays as adaptive as the next one
    data = {"format": FORMAT, **_capped_counts(model),
            "kinds": {str(kind): _capped_counts(pool) for kind, pool in model.by_kind.items()}}
    with FileLock(str(path) + ".lock"):
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)


def with_learned_rates(model: AcceptanceModel, calibration_file=None) -> AcceptanceModel:
    """`model` with the rates learnt on this machine loaded, saving them as requests finish
    (AcceptanceModel.request_done); unchanged when REDWOOD_LEARNED_RATES=0."""
    path = learned_rates_path(calibration_file)
    if path is not None:
        load_learned(model, path)
        model.persist = lambda m: _save_quietly(m, path)
    return model


def _save_quietly(model: AcceptanceModel, path: Path) -> None:
    """A full disk or a read-only cache must not fail a request: say so once and go on."""
    try:
        save_learned(model, path)
    except OSError as error:
        print(f"redwood: cannot save learnt n-gram rates to {path} ({error}); "
              f"set {ENV}=0 or REDWOOD_CACHE to a writable directory", file=sys.stderr)
        model.persist = None


def _counts(data: dict) -> tuple[dict, dict]:
    """One pool's (counts, drafts) as saved."""
    return ({_key(text, 4): _pair(v) for text, v in data["counts"].items()},
            {_key(text, 2): _pair(v) for text, v in data["drafts"].items()})


def _add(model: AcceptanceModel, counts: dict, drafts: dict) -> bool:
    model.counts.update(counts)
    model.drafts.update(drafts)
    return bool(counts or drafts)


def _capped_counts(model: AcceptanceModel) -> dict:
    """The pool's counts capped (module doc), in the model and as saved."""
    model.counts.update({k: _capped(v, MAX_TRIALS) for k, v in model.counts.items()})
    model.drafts.update({k: _capped(v, MAX_DRAFT_TOKENS) for k, v in model.drafts.items()})
    return {"counts": {_text(k): v for k, v in model.counts.items()},
            "drafts": {_text(k): v for k, v in model.drafts.items()}}


def _capped(value, most: float) -> list[float]:
    """[accepted, trials] (or [kept, predicted]) scaled so that the second is at most `most`."""
    a, b = float(value[0]), float(value[1])
    scale = min(1.0, most / b) if b > 0 else 1.0
    return [a * scale, b * scale]


def _text(key: tuple) -> str:
    return ",".join(str(int(part)) for part in key)


def _key(text: str, length: int) -> tuple:
    parts = [int(p) for p in text.split(",")]
    if len(parts) != length:
        raise ValueError(f"key {text!r} has {len(parts)} parts, not {length}")
    if length == 4:
        return bool(parts[0]), parts[1], parts[2], bool(parts[3])
    return bool(parts[0]), bool(parts[1])


def _pair(value) -> list[float]:
    a, b = float(value[0]), float(value[1])
    if not (0.0 <= a and 0.0 <= b):
        raise ValueError(f"negative count {value!r}")
    return [a, b]
