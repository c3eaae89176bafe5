"""measure/machine_profile.choose_linear_rows: each row count goes to the kernel that timed
faster on this machine's Linear shapes; the choice is measured once per (machine, shapes,
versions), cached under profiles/kernels/, and a routed model gets its own latency profile."""
from __future__ import annotations

import json
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from redwood.backends.hf import HFBackend
from redwood.measure import machine_profile as mp
from redwood.models import cpu_kernels
from redwood.models.tiny_random import tiny_model

pytestmark = pytest.mark.skipif(not cpu_kernels.fast_linear_available(), reason="no oneDNN")


def fake_timings(onednn_wins):
    calls = []

    def measure(model, rows, progress):
        calls.append(list(rows))
        return {n: {"f_linear": 10.0, "onednn": 5.0 if n in onednn_wins else 20.0} for n in rows}
    return measure, calls


def test_the_faster_kernel_is_chosen_per_row_count(tmp_path, monkeypatch):
    """Make F.linear slow for 3 and 7 rows and oneDNN slow elsewhere (2 ms a call, far above
    either kernel on a tiny model): the real timing picks oneDNN for exactly 3 and 7."""
    def slow_if(condition, kernel):
        def wrapped(x, weight, bias=None):
            if condition(x.numel() // x.shape[-1]):
                time.sleep(0.002)
            return kernel(x, weight, bias)
        return wrapped

    monkeypatch.setattr(F, "linear", slow_if(lambda n: n in (3, 7), F.linear))
    monkeypatch.setattr(cpu_kernels, "onednn_linear",
                        slow_if(lambda n: n not in (3, 7), cpu_kernels.onednn_linear))
    chosen = mp.choose_linear_rows(tiny_model(seed=1), rows=range(1, 9), cache_dir=tmp_path,
                                   progress=False)
    assert chosen == frozenset({3, 7})


def test_choice_is_cached_and_keyed(tmp_path, monkeypatch):
    model = tiny_model(seed=2)
    measure, calls = fake_timings({2, 4, 5})
    first = mp.choose_linear_rows(model, rows=range(1, 7), cache_dir=tmp_path, progress=False,
                                  measure=measure)
    again = mp.choose_linear_rows(model, rows=range(1, 7), cache_dir=tmp_path, progress=False,
                                  measure=measure)
    assert first == again == frozenset({2, 4, 5}) and calls == [[1, 2, 3, 4, 5, 6]]
    path = next((tmp_path / "profiles" / "kernels").glob("*.json"))
    data = json.loads(path.read_text())
    assert data["onednn_rows"] == [2, 4, 5] and data["ms"]["2"] == {"f_linear": 10.0, "onednn": 5.0}
    assert data["cpu"] == mp.cpu_model() and data["threads"] == torch.get_num_threads()
    # another shape (a wider model), other row counts or another thread count: measured again
    mp.choose_linear_rows(tiny_model(seed=2, hidden_size=64), rows=range(1, 7),
                          cache_dir=tmp_path, progress=False, measure=measure)
    mp.choose_linear_rows(model, rows=range(1, 9), cache_dir=tmp_path, progress=False,
                          measure=measure)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    mp.choose_linear_rows(model, rows=range(1, 7), cache_dir=tmp_path, progress=False,
                          measure=measure)
    assert len(calls) == 4


def test_damaged_or_foreign_choice_is_measured_again(tmp_path):
    model = tiny_model(seed=3)
    measure, calls = fake_timings({1})
    mp.choose_linear_rows(model, rows=[1, 2], cache_dir=tmp_path, progress=False, measure=measure)
    path = next((tmp_path / "profiles" / "kernels").glob("*.json"))
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "cpu": "Some Other CPU", "onednn_rows": [2]}))
    assert mp.choose_linear_rows(model, rows=[1, 2], cache_dir=tmp_path, progress=False,
                                 measure=measure) == frozenset({1})
    path.write_text("{not json")
    mp.choose_linear_rows(model, rows=[1, 2], cache_dir=tmp_path, progress=False, measure=measure)
    assert len(calls) == 3


def test_near_ties_stay_on_f_linear(tmp_path):
    def measure(model, rows, progress):
        return {1: {"f_linear": 10.0, "onednn": 9.9}, 2: {"f_linear": 10.0, "onednn": 9.0}}
    assert mp.choose_linear_rows(tiny_model(seed=4), rows=[1, 2], cache_dir=tmp_path,
                                 progress=False, measure=measure) == frozenset({2})


def test_a_model_without_float_linears_needs_no_choice(tmp_path):
    model = cpu_kernels.quantize_int8(tiny_model(seed=5))
    measure, calls = fake_timings({1})
    assert mp.choose_linear_rows(model, cache_dir=tmp_path, progress=False, measure=measure) \
        == frozenset() and calls == []


def test_use_fastest_linear_routes_a_tiny_model(tmp_path, monkeypatch, capsys):
    """The full path on a tiny random model: real timing, then routing by the choice; the
    routed model computes the same logits, through oneDNN for exactly the chosen rows."""
    monkeypatch.setenv("REDWOOD_CACHE", str(tmp_path))
    model = tiny_model(seed=6)
    stock_model = tiny_model(seed=6)
    rows = mp.use_fastest_linear(model)
    assert rows <= frozenset(mp.TIMED_ROWS)          # tree sizes and prompt lengths
    assert "F.linear vs oneDNN" in capsys.readouterr().err
    routed = cpu_kernels.onednn_rows(model, upto=32)
    assert routed == (None if not rows else tuple(sorted(n for n in rows if n <= 32)))
    calls = []
    real = cpu_kernels.onednn_linear
    monkeypatch.setattr(cpu_kernels, "onednn_linear",
                        lambda x, w, b: calls.append(x.numel() // x.shape[-1]) or real(x, w, b))
    layers = sum(type(m) is nn.Linear for m in model.modules())
    vocab = model.config.vocab_size
    for n, nearest in ((1, 1), (2, 2), (5, 5), (33, 32), (60, 64), (100, 96)):
        ids = (2 + torch.arange(n) % (vocab - 2))[None]
        with torch.inference_mode():
            torch.testing.assert_close(model(ids).logits, stock_model(ids).logits,
                                       rtol=1e-5, atol=1e-5)
        assert calls.count(n) == (layers if nearest in rows else 0), (n, sorted(rows))
        calls.clear()


def test_a_prompt_takes_the_kernel_of_the_nearest_timed_length():
    """Prefill lengths are timed at a few counts; any other length is routed like the timed
    count nearest it on a log scale (exact counts as chosen, beyond the longest as the
    longest), so a 150-token prompt is not left on a kernel that loses at 128 and 192."""
    use = cpu_kernels.nearest_timed_rows({1, 2, 128, 192}, timed=[1, 2, 3, 64, 128, 192, 512])
    assert [use(n) for n in (1, 2, 3)] == [True, True, False]
    assert not use(4) and not use(70) and not use(90)       # nearest 3 / 64 / 64
    assert use(100) and use(150) and use(250)                # nearest 128 / 128-192 / 192
    assert not use(400) and not use(4096)                    # nearest 512, and beyond it
    routed = cpu_kernels.apply_kernel_choice(tiny_model(seed=9), {128}, timed=mp.TIMED_ROWS)
    assert routed > 0


def test_routing_text_names_small_rows_and_prompts():
    assert mp.routing_text(frozenset(mp.TIMED_ROWS)) == "1-32 and prompts (33+ rows)"
    assert mp.routing_text({4, 5, 6, 128}) == "4-6 and prompts near 128 rows"
    assert mp.routing_text({2}) == "2" and mp.routing_text(set()) == ""


def test_the_latency_profile_key_follows_the_routing():
    """A profile measured with oneDNN rows is never reused for another routing, while stock
    models keep the key they had before kernel choice existed (no field added)."""
    target, draft = tiny_model(seed=7), tiny_model(seed=8)
    stock_key = mp.profile_key(HFBackend(target), HFBackend(draft))
    assert "linear_rows" not in stock_key
    cpu_kernels.apply_kernel_choice(target, {1, 2, 3})
    routed = mp.profile_key(HFBackend(target), HFBackend(draft))
    assert routed["linear_rows"] == {"target": [1, 2, 3], "draft": None}
    cpu_kernels.apply_kernel_choice(target, {4})
    assert mp.key_digest(mp.profile_key(HFBackend(target), HFBackend(draft))) \
        != mp.key_digest(routed) != mp.key_digest(stock_key)
