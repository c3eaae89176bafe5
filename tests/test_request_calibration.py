"""Per-request calibration of the n-gram drafter's predictions (decode/ngram_acceptance.py's
RequestCalibration): its arithmetic, and a drafter whose pooled rates promise more than this
request keeps turning plain within a few steps while one whose drafts are kept keeps drafting."""
from __future__ import annotations

import random

import pytest
import torch

from redwood.decode.drafter import ChildChooser
from redwood.decode.layout import TreeLayout
from redwood.decode.ngram_acceptance import (CALIBRATION_PRIOR_TOKENS, CALIBRATION_RANGE,
                                             MATCH_BUCKETS, AcceptanceModel, RequestCalibration)
from redwood.decode.ngram_drafter import NgramDrafter
from redwood.errors import RedwoodError
from redwood.plan.tree import chain

STEEP = {1: 10.0, 2: 15.0, 3: 19.0, 4: 22.0, 6: 28.0, 8: 33.0, 12: 45.0}
CYCLE = list(range(1, 9))                     # the prompt: 1 2 ... 8, four times over


def test_factor_is_kept_over_predicted_with_a_prior_and_clamped():
    calibration = RequestCalibration()
    assert calibration.factor == 1.0
    calibration.record(predicted=8.0, kept=0)
    w = CALIBRATION_PRIOR_TOKENS
    assert calibration.factor == pytest.approx(w / (8.0 + w))
    calibration.record(predicted=100.0, kept=0)
    assert calibration.factor == CALIBRATION_RANGE[0]
    calibration.reset()
    calibration.record(predicted=1.0, kept=50)
    assert calibration.factor == CALIBRATION_RANGE[1]
    with pytest.raises(RedwoodError, match="prior"):
        RequestCalibration(prior_tokens=0)


def test_scaled_values_stay_in_order_and_below_one():
    calibration = RequestCalibration()
    calibration.record(predicted=2.0, kept=8)           # factor (8 + 8) / (2 + 8) = 1.6
    values = [0.9, 0.81, 0.5, 0.1]
    scaled = calibration.scale(values)
    assert scaled == pytest.approx([1.0, 1.0, 0.8, 0.16])
    assert scaled == sorted(scaled, reverse=True)


def frozen_drafter(learn: bool = True) -> NgramDrafter:
    """Every pooled rate at 0.9 and held there (a prior worth a million observations), so only
    the per-request calibration can change what is drafted."""
    model = AcceptanceModel(prior_rank1=(0.9,) * MATCH_BUCKETS, prior_weight=1e6)
    return NgramDrafter(target_ms=STEEP, model=model, learn=learn, max_length=12)


def drafted_steps(drafter: NgramDrafter, truth: list[int]) -> list[bool]:
    """Decode `truth` after the CYCLE prompt, the target keeping exactly what `truth` says next;
    whether each step drafted anything."""
    layout, greedy = TreeLayout.build(chain(12), "cpu"), ChildChooser(True)
    drafter.prefill(torch.tensor(CYCLE * 4))
    drafted, at = [], 0
    while at < len(truth) - 1:
        proposal = drafter.propose(truth[at], layout, greedy)
        tokens = proposal.tokens.tolist()
        kept = 1
        while kept < len(tokens) and at + kept < len(truth) and tokens[kept] == truth[at + kept]:
            kept += 1
        drafter.commit(list(range(kept)), proposal.tokens)
        drafted.append(len(tokens) > 1)
        at += kept
    return drafted


def unlike_the_prompt(length: int, seed: int = 0) -> list[int]:
    """Tokens of the prompt's vocabulary that never follow each other as in the prompt (r is
    never followed by r + 1), so every draft taken from the prompt is rejected at once."""
    rng, out = random.Random(seed), [1]
    while len(out) < length:
        out.append((out[-1] - 1 + rng.randint(2, 7)) % 8 + 1)
    return out


def test_a_request_that_keeps_less_than_predicted_turns_plain_within_a_few_steps():
    truth = unlike_the_prompt(40)
    uncalibrated = drafted_steps(frozen_drafter(learn=False), truth)
    assert all(uncalibrated[:10])                      # the pooled rates alone keep drafting
    drafter = frozen_drafter()
    calibrated = drafted_steps(drafter, truth)
    assert calibrated[0] and not any(calibrated[3:])
    assert drafter.calibration.factor < 0.6
    # A new request starts from the pooled rates again, and one whose drafts are kept drafts on.
    copying = drafted_steps(drafter, CYCLE * 6)
    assert all(copying) and drafter.calibration.factor >= 1.0
