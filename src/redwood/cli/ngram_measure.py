"""`redwood calibrate --drafter ngram` and the n-gram part of `redwood tune --drafter
ngram|hybrid|auto`: per-source calibration of the n-gram drafter (measure/ngram_calibration.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from redwood.errors import RedwoodError

NGRAM_FILE = "ngram-acceptance.json"


def ngram_prompts(pair, source: str, count: int | None, quick: bool):
    """(prompt ids, dataset label): `edits` = the calibration split's edit tasks, else what
    the model calibration reads (HumanEval calibration split or a JSONL file)."""
    from redwood.measure.tune import prompts_for

    if source == "edits" and not quick and pair.tokenizer is not None:
        from redwood.measure.ngram_calibration import edit_prompts

        return edit_prompts(pair.tokenizer, count or 12)
    return prompts_for(pair, "humaneval" if source == "edits" else source, count, quick=quick)


def summary_lines(calibration) -> list[str]:
    """Measured rank-1 acceptance by match length (depth 1), greedy and sampled."""
    from redwood.decode.ngram_acceptance import MATCH_LABELS

    lines = []
    for greedy in (True, False):
        cells = []
        for match, label in enumerate(MATCH_LABELS):
            accepted, trials = calibration.counts.get((greedy, match, 0, False), (0.0, 0.0))
            rate = f"{accepted / trials:.2f}" if trials else "–"
            cells.append(f"match {label}: {rate} ({trials:.0f})")
        lines.append(f"{'greedy ' if greedy else 'sampled'} rank-1 acceptance at depth 1 — "
                     + ", ".join(cells))
    return lines


def cmd_calibrate_ngram(args, max_new: int, command: str = "") -> int:
    from redwood.cli.options import _model_config
    from redwood.measure.ngram_calibration import calibrate_ngram
    from redwood.measure.tune import load_models

    pair = load_models(_model_config(args), quick=args.quick)
    prompts, dataset = ngram_prompts(pair, args.prompts, args.num_prompts, args.quick)
    calibration = calibrate_ngram(pair.target, prompts, args.temperature, max_new, args.seed,
                                  dataset=dataset)
    calibration.extra["command"] = command
    for line in summary_lines(calibration):
        print(line)
    calibration.save(args.out)
    print(f"wrote {args.out} ({calibration.extra['tokens']} tokens, "
          f"{calibration.extra['seconds']:.0f} s)")
    if args.add_to is not None:
        merge_into_bundle(calibration, Path(args.add_to))
    return 0


def check_bundle_dir(directory) -> None:
    """--add-to names a bundle directory (checked before minutes of decoding)."""
    if not (Path(directory) / "bundle.json").is_file():
        raise RedwoodError(f"--add-to {directory}: not a bundle directory (no bundle.json); "
                           f"give one written by `redwood tune`")


def merge_into_bundle(calibration, directory: Path) -> None:
    """Add `calibration`'s counts to the bundle's n-gram calibration (created when it has
    none), its datasets listed one after another, and point the bundle index at it."""
    from redwood.measure.ngram_calibration import NgramCalibration

    path = directory / NGRAM_FILE
    merged = calibration
    if path.is_file():
        old = NgramCalibration.load(path)
        merged = old.merged(calibration)
        for key in ("dataset", "command"):       # what made each part, one after another
            parts = [part.extra.get(key) for part in (old, calibration)]
            merged.extra[key] = "; ".join(p for p in parts if p)
        merged.extra["prompts"] = sum(part.extra.get("prompts", 0) for part in (old, calibration))
    merged.save(path)
    _point_index_at(directory)
    print(f"n-gram calibration of {directory}: now {merged.extra.get('tokens', 0)} tokens",
          file=sys.stderr)


def _point_index_at(directory: Path) -> None:
    index_path = directory / "bundle.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError) as exc:
        raise RedwoodError(f"{index_path}: cannot update the bundle index ({exc})") from None
    index["ngram_acceptance"] = NGRAM_FILE
    index_path.write_text(json.dumps(index, indent=1) + "\n")


def add_to_bundle(args, pair, directory: Path, temperatures, max_new: int) -> None:
    """Calibrate the n-gram drafter at each temperature on the edit tasks (and the tune's own
    prompts' source) and record it in the bundle: ngram-acceptance.json + the index key."""
    from redwood.measure.ngram_calibration import calibrate_ngram

    prompts, dataset = ngram_prompts(pair, "edits", None if not args.quick else 4, args.quick)
    merged = None
    for temperature in temperatures:
        calibration = calibrate_ngram(pair.target, prompts, temperature, max_new, args.seed,
                                      dataset=dataset)
        merged = calibration if merged is None else merged.merged(calibration)
    for line in summary_lines(merged):
        print(line)
    merged.save(directory / NGRAM_FILE)
    _point_index_at(directory)
    print(f"n-gram calibration added to {directory} ({merged.extra.get('tokens', 0)} tokens)",
          file=sys.stderr)
