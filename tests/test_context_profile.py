"""The target's forward times by context length: Profile.target_ms_at (interpolation, clamping,
fallback), the JSON format (round trip, old files), the llama.cpp first-use profile measuring
the table (tiny GGUF), and the n-gram drafter sizing its trees at the request's context."""
from __future__ import annotations

import json

import pytest
import torch

from redwood.decode.drafter import ChildChooser
from redwood.decode.layout import TreeLayout
from redwood.decode.ngram_acceptance import MATCH_BUCKETS, AcceptanceModel
from redwood.decode.ngram_drafter import NgramDrafter
from redwood.errors import RedwoodError
from redwood.measure import machine_profile as mp
from redwood.plan.formats import Profile, interpolate_by_context, sample_profile_path
from redwood.plan.live_costs import CONTEXT_BUCKET, LiveCosts
from redwood.plan.tree import chain
from tiny_gguf import tiny_gguf_pair  # noqa: F401  (session fixture)

TABLE = {128: {1: 10.0, 2: 20.0, 4: 40.0}, 1024: {1: 19.0, 2: 29.0}, 2048: {1: 30.0, 2: 40.0}}


def profile(by_context=None) -> Profile:
    return Profile(target_ms={1: 10.0, 2: 20.0, 4: 40.0}, draft_ms={1: 5.0}, context=128,
                   target_ms_by_context=by_context)


# -- Profile.target_ms_at ------------------------------------------------------------------

def test_linear_between_the_two_nearest_contexts():
    at = profile(TABLE).target_ms_at(576)                 # half way from 128 to 1024
    assert at == pytest.approx({1: 14.5, 2: 24.5})        # size 4 was not measured at 1024
    assert profile(TABLE).target_ms_at(1536) == pytest.approx({1: 24.5, 2: 34.5})
    assert profile(TABLE).target_ms_at(1024) == {1: 19.0, 2: 29.0}


@pytest.mark.parametrize("context, expected", [(1, {1: 10.0, 2: 20.0}), (128, {1: 10.0, 2: 20.0}),
                                               (2048, {1: 30.0, 2: 40.0}),
                                               (10**6, {1: 30.0, 2: 40.0})])
def test_constant_beyond_the_measured_contexts(context, expected):
    assert profile(TABLE).target_ms_at(context) == expected


def test_one_context_or_none_falls_back():
    assert profile().target_ms_at(4000) == {1: 10.0, 2: 20.0, 4: 40.0}
    assert profile({512: {1: 12.0, 4: 30.0}}).target_ms_at(4000) == {1: 12.0, 4: 30.0}
    assert interpolate_by_context({128: {1: 1.0}}, 5) == {1: 1.0}


# -- the file format -----------------------------------------------------------------------

def test_round_trip_keeps_the_table(tmp_path):
    original = profile(TABLE)
    data = json.loads(json.dumps(original.to_dict()))
    assert data["target_ms_by_context"]["1024"] == {"1": 19.0, "2": 29.0}
    loaded = Profile.load(original.save(tmp_path / "p.json"))
    assert loaded.target_ms_by_context == TABLE and loaded.target_ms == original.target_ms
    assert "target_ms_by_context" not in loaded.extra


def test_old_files_load_without_a_table():
    shipped = Profile.load(sample_profile_path())
    assert shipped.target_ms_by_context is None
    assert shipped.target_ms_at(3000) == shipped.target_ms
    assert "target_ms_by_context" not in profile().to_dict()   # old readers see the old format


@pytest.mark.parametrize("table, message", [
    ({"abc": {"1": 1.0}}, "not a positive context"), ({"0": {"1": 1.0}}, "not a positive context"),
    ({"128": {"2": 1.0}}, "no entry for size 1"), ({"128": {"1": -1.0}}, "positive milliseconds"),
    ({}, "non-empty"), ([1, 2], "non-empty")])
def test_a_bad_table_is_refused(table, message):
    data = {**profile().to_dict(), "target_ms_by_context": table}
    with pytest.raises(RedwoodError, match=message):
        Profile.from_dict(data)


# -- measuring it on llama.cpp (tiny GGUF) --------------------------------------------------

def test_contexts_are_cut_to_what_n_ctx_leaves():
    class Fake:
        kind, max_positions = "llamacpp", 4096

    assert mp.profile_contexts(Fake(), [1, 2, 48]) == [128, 1024, 2048]
    Fake.max_positions = 1100                                  # 1100 - 48 - 8 = 1044
    assert mp.profile_contexts(Fake(), [1, 48]) == [128, 1024, 1044]
    Fake.max_positions = 1000
    assert mp.profile_contexts(Fake(), [1, 48]) == [128, 944]
    Fake.max_positions = 150
    assert mp.profile_contexts(Fake(), [1, 48]) == [128]
    Fake.kind = "hf"
    assert mp.profile_contexts(Fake(), [1, 48]) == []          # the hf profile is unchanged


@pytest.fixture
def llama_pair(tiny_gguf_pair):
    from redwood.backends.llamacpp import LlamaCppBackend

    backends = [LlamaCppBackend(path, n_ctx=1280, n_threads=2) for path in tiny_gguf_pair]
    yield backends
    for backend in backends:
        backend.close()


def test_the_first_use_profile_measures_the_table(tmp_path, llama_pair, capsys):
    sizes = [1, 2, 4, 8]
    expected = mp.profile_contexts(llama_pair[0], sizes)
    room = llama_pair[0].max_positions - 8 - 8                 # 2,048 is cut to what fits
    assert expected == [128, 1024, room]
    measured = mp.machine_profile(*llama_pair, sizes=sizes, cache_dir=tmp_path, progress=True)
    table = measured.target_ms_by_context
    assert sorted(table) == expected and all(sorted(t) == sizes for t in table.values())
    assert table[128] == measured.target_ms                    # the 128 table is target_ms
    assert all(ms > 0 for t in table.values() for ms in t.values())
    assert "1024-token context" in capsys.readouterr().err     # a progress line per context
    assert measured.extra["machine_key"]["contexts"] == expected
    assert llama_pair[0].cache_length() == 0                   # the cache is left empty
    again = mp.machine_profile(*llama_pair, sizes=sizes, cache_dir=tmp_path, progress=False,
                               measure=lambda *args: pytest.fail("cached: not measured again"))
    assert again.target_ms_by_context == table


def test_a_profile_cached_before_the_table_is_measured_again(tmp_path, llama_pair, monkeypatch):
    calls = []

    def measure(target, draft, sizes, progress):
        calls.append(sizes)
        return Profile(target_ms={n: 30.0 + n for n in sizes}, draft_ms={1: 5.0})

    with monkeypatch.context() as patch:                        # the key as it was before
        patch.setattr(mp, "profile_contexts", lambda target, sizes: [])
        mp.machine_profile(*llama_pair, sizes=[1, 2], cache_dir=tmp_path, progress=False,
                           measure=measure)
    mp.machine_profile(*llama_pair, sizes=[1, 2], cache_dir=tmp_path, progress=False,
                       measure=measure)
    assert len(calls) == 2


def test_each_context_is_timed_on_a_cache_that_long(llama_pair):
    """The trees are timed with exactly `context` committed tokens under them."""
    from redwood.measure.profile import profile_target_by_context

    target = llama_pair[0]
    seen = []

    def timer(fn):
        seen.append(target.cache_length())
        fn()
        return 0.001 * (1 + target.cache_length() / 1000)

    table = profile_target_by_context(target, [600, 200], [1, 3], repeats=2, warmup=1,
                                      progress=False, timer=timer)
    assert sorted(table) == [200, 600] and seen == [200] * 6 + [600] * 6
    assert table[200] == pytest.approx({1: 1.2, 3: 1.2}) and table[600][3] == pytest.approx(1.6)


# -- the n-gram drafter at the request's context --------------------------------------------

SHORT = {1: 10.0, 2: 15.0, 3: 19.0, 4: 22.0, 6: 28.0, 8: 33.0, 12: 45.0}
LONG = {1: 10.0, 2: 15.0, 3: 19.0, 4: 22.0, 6: 40.0, 8: 60.0, 12: 90.0}   # big trees dearer
REPEATED = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
PADDING = list(range(100, 2300))          # 2,200 distinct tokens: no match, only context


def best_n(times: dict, c: float = 0.9, most: int = 9) -> int:
    """argmax E(n) / t(n) over a chain of values c, c^2, ... (ties to the smaller n)."""
    rates = {n: (1 + sum(c ** k for k in range(1, n))) / t for n, t in times.items() if n <= most}
    best = 1
    for n in sorted(rates):
        best = n if rates[n] > rates[best] else best
    return best


def proposed(drafter, text) -> int:
    drafter.prefill(torch.tensor(text))
    proposal = drafter.propose(3, TreeLayout.build(chain(12), "cpu"), ChildChooser(True))
    drafter.commit([0], proposal.tokens)
    return len(proposal.tokens)


def drafter(by_context, **options) -> NgramDrafter:
    model = AcceptanceModel(prior_rank1=(0.9,) * MATCH_BUCKETS, prior_later=0.5)
    return NgramDrafter(target_ms=SHORT, target_ms_by_context=by_context, model=model, **options)


def test_a_long_context_picks_a_smaller_tree_than_a_short_one():
    tables = {128: SHORT, 2048: LONG}
    assert best_n(SHORT) == 8 and best_n(LONG) == 4
    assert proposed(drafter(tables), REPEATED) == 8              # context 18: the 128 table
    assert proposed(drafter(tables), PADDING + REPEATED) == 4    # context 2,218: the 2,048 one
    assert proposed(drafter(None), PADDING + REPEATED) == 8      # without the table: as before
    dear = {128: SHORT, 2048: {n: 10.0 * n for n in SHORT}}      # every node costs t(1)
    assert proposed(drafter(dear), PADDING + REPEATED) == 1      # then plain (the root alone)


def test_live_costs_multiply_on_top_of_the_context_table():
    ngram = drafter({128: SHORT, 2048: LONG})
    ngram.prefill(torch.tensor(PADDING + REPEATED))
    values = [0.9 ** k for k in range(1, 9)]
    assert ngram.best_size(values, 12)[0] == 4
    ngram.costs = LiveCosts(SHORT)
    for _ in range(10):
        ngram.costs.record_target(4, 0.066)                      # 3x the profile's t(4)
    assert ngram.best_size(values, 12)[0] < 4


def test_the_table_is_read_again_only_in_a_new_bucket():
    ngram = drafter({128: {1: 10.0, 2: 15.0}, 2048: {1: 30.0, 2: 35.0}})
    ngram.prefill(torch.tensor(list(range(100, 100 + 3 * CONTEXT_BUCKET + 1))))
    first = ngram.step_target_ms()
    assert first == pytest.approx({1: 10.0 + 20.0 * (192 - 128) / 1920,
                                   2: 15.0 + 20.0 * (192 - 128) / 1920})
    ngram.index.extend([7] * (CONTEXT_BUCKET - 2))               # still bucket 3
    assert ngram.step_target_ms() is first
    ngram.index.extend([7])                                      # 256 tokens: bucket 4
    assert ngram.step_target_ms()[1] == pytest.approx(10.0 + 20.0 * 128 / 1920)
