"""The pooled acceptance model as requests teach it (decode/ngram_acceptance.py): each request
gives the pool its own rate of a key at a capped weight, so verbose requests do not outvote
short ones."""
from __future__ import annotations

import pytest

from redwood.decode.ngram_acceptance import (OWN_WEIGHT, REQUEST_TRIALS, AcceptanceModel,
                                              RequestEstimates)


def test_a_request_teaches_the_pool_its_rate_at_a_capped_weight():
    """A verbose request (a code answer observing a resumed copy a hundred times) must not
    outvote a short one: each gives the pool its own rate of a key at a weight of at most
    REQUEST_TRIALS observations, while its own estimate uses all of them."""
    key = (True, 7, 0, False)
    model = AcceptanceModel()
    verbose = RequestEstimates(model)
    for i in range(100):
        verbose.observe(key, i % 10 != 0)                 # keeps 0.9 of 100
    assert model.counts[key] == pytest.approx([0.9 * REQUEST_TRIALS, REQUEST_TRIALS])
    assert verbose.rate(key) == pytest.approx(
        (90 + model.rate(key) * OWN_WEIGHT) / (100 + OWN_WEIGHT))
    short = RequestEstimates(model)
    for accepted in (False, True, False, False):          # below the cap: one by one
        short.observe(key, accepted)
    assert model.counts[key] == pytest.approx([0.9 * REQUEST_TRIALS + 1, REQUEST_TRIALS + 4])


def test_a_share_taught_before_a_save_scaled_the_pool_stays_a_count():
    """The learnt-rates save scales the pool's counts down (measure/learned_rates.py) while a
    request still re-weights what it taught: the counts never go negative or past trials."""
    key = (True, 7, 0, False)
    model = AcceptanceModel()
    request = RequestEstimates(model)
    for _ in range(int(REQUEST_TRIALS)):
        request.observe(key, True)
    model.counts[key] = [0.5, 1.0]                        # scaled down under the request
    for _ in range(50):
        request.observe(key, False)                       # its rate falls: it takes back
    accepted, trials = model.counts[key]
    assert 0.0 <= accepted <= trials
    model.teach(key, -5.0, -5.0)
    assert model.counts[key] == [0.0, 0.0]
