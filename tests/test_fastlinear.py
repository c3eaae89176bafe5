"""models/cpu_kernels.py: the oneDNN small-row path computes the same function as F.linear,
only for the configured row counts, and int8 dynamic quantisation keeps a tiny model's
predictions."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from redwood import models
from redwood.errors import RedwoodError
from redwood.models import cpu_kernels as fastlinear
from test_models import tiny_causal_lm

pytestmark = pytest.mark.skipif(not fastlinear.fast_linear_available(), reason="no oneDNN")


@pytest.fixture
def onednn_calls(monkeypatch):
    """Counts calls that take the oneDNN path."""
    calls = []
    real = fastlinear.onednn_linear

    def counting(x, weight, bias):
        calls.append(x.numel() // x.shape[-1])
        return real(x, weight, bias)

    monkeypatch.setattr(fastlinear, "onednn_linear", counting)
    return calls


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_fast_linear_matches_stock_for_every_row_count(arch, onednn_calls):
    model = tiny_causal_lm(arch, vocab_size=96, seed=3)
    linears = sum(type(m) is nn.Linear for m in model.modules())
    generator = torch.Generator().manual_seed(0)
    for n in range(1, 18):
        ids = torch.randint(0, 96, (1, n), generator=generator)
        with torch.inference_mode():
            stock = model(ids).logits
            assert fastlinear.enable_fast_linear(model, rows=(2, 15)) == linears
            fast = model(ids).logits
            assert fastlinear.disable_fast_linear(model) == linears
            again = model(ids).logits
        torch.testing.assert_close(fast, stock, rtol=1e-5, atol=1e-5)
        assert torch.equal(again, stock)                     # disabling restores F.linear exactly
        expected = linears if 2 <= n <= 15 else 0
        assert onednn_calls.count(n) == expected, n
        onednn_calls.clear()


def test_fast_linear_leaves_gradients_and_other_dtypes_alone(onednn_calls):
    model = tiny_causal_lm("qwen2")
    fastlinear.enable_fast_linear(model)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()       # grad mode: stock path
    assert onednn_calls == [] and model.lm_head.weight.grad is not None
    with torch.inference_mode():
        model.to(torch.float64)(torch.tensor([[1, 2, 3]]))
    assert onednn_calls == []


def test_load_model_flags(tmp_path, onednn_calls):
    original = tiny_causal_lm("qwen2", seed=4)
    original.save_pretrained(str(tmp_path))
    ids = torch.tensor([[5, 6, 7, 8]])
    fast = models.load_model(tmp_path, fast_linear=True)
    with torch.inference_mode():
        torch.testing.assert_close(fast(ids).logits, original(ids).logits, rtol=1e-5, atol=1e-5)
    assert onednn_calls
    int8 = models.load_model(tmp_path, quantize="int8")
    assert not any(type(m) is nn.Linear for m in int8.modules())
    with torch.inference_mode():
        quantised, exact = int8(ids).logits, original(ids).logits
    # int8 weights: logits move by a small fraction of their spread, ranking mostly kept
    assert (quantised - exact).abs().max() < 0.1 * exact.std()
    assert (quantised.argmax(-1) == exact.argmax(-1)).float().mean() >= 0.75
    with pytest.raises(RedwoodError, match="unknown quantisation 'int4'"):
        models.load_model(tmp_path, quantize="int4")


@pytest.mark.parametrize("rows", [frozenset({1, 3, 8}), [1, 3, 8], (lambda n: n in (1, 3, 8))])
def test_a_set_or_predicate_routes_exactly_those_row_counts(rows, onednn_calls):
    model = tiny_causal_lm("qwen2", vocab_size=96, seed=5)
    linears = sum(type(m) is nn.Linear for m in model.modules())
    generator = torch.Generator().manual_seed(1)
    for n in range(1, 11):
        ids = torch.randint(0, 96, (1, n), generator=generator)
        with torch.inference_mode():
            stock = model(ids).logits
            fastlinear.enable_fast_linear(model, rows=rows)
            fast = model(ids).logits
            fastlinear.disable_fast_linear(model)
        torch.testing.assert_close(fast, stock, rtol=1e-5, atol=1e-5)
        assert onednn_calls.count(n) == (linears if n in (1, 3, 8) else 0), n
        onednn_calls.clear()


def test_apply_kernel_choice_and_onednn_rows_report_the_routing(onednn_calls):
    model = tiny_causal_lm("qwen2", seed=6)
    assert fastlinear.onednn_rows(model) is None                  # never patched
    assert fastlinear.apply_kernel_choice(model, {2, 5}) > 0
    assert fastlinear.onednn_rows(model, upto=8) == (2, 5)
    fastlinear.enable_fast_linear(model)                           # the old (4, 64) range
    assert fastlinear.onednn_rows(model) == tuple(range(4, 65))
    assert fastlinear.apply_kernel_choice(model, set()) == 0      # nothing wins: stock layers
    assert fastlinear.onednn_rows(model) is None
    with torch.inference_mode():
        model(torch.tensor([[1, 2, 3, 4, 5]]))
    assert onednn_calls == []


def test_kernel_timings_cover_every_row_count_and_the_shapes():
    model = tiny_causal_lm("qwen2", vocab_size=96, seed=7)
    shapes = fastlinear.linear_shapes(model)
    layers = [m for m in model.modules() if type(m) is nn.Linear]
    assert sum(s[3] for s in shapes) == len(layers)
    assert {(s[0], s[1]) for s in shapes} == {(m.out_features, m.in_features) for m in layers}
    rounds = []
    timings = fastlinear.time_linear_kernels(model, [1, 4, 9], repeats=2,
                                             progress=lambda done, total: rounds.append(done))
    assert rounds == [0, 1, 2]
    assert sorted(timings) == [1, 4, 9]
    assert all(t["f_linear"] > 0 and t["onednn"] > 0 for t in timings.values())
    assert fastlinear.time_linear_kernels(fastlinear.quantize_int8(model), [1]) == {}
