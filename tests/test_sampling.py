"""process_logits against plain reference computations; propose_children against the
exact laws of sampling with and without replacement (chi-square, alpha = 0.001)."""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from redwood.errors import RedwoodError
from redwood.decode import sampling
from redwood.decode.sampling import greedy_children, process_logits, propose_children, sample_token

ALPHA = 1e-3


def assert_law(counts: Counter, law: dict, draws: int) -> None:
    """Chi-square of observed counts against an exact law {outcome: prob}. Outcomes of
    probability 0 must never occur; cells expected below 5 are pooled."""
    impossible = [o for o in counts if law.get(o, 0.0) <= 0.0]
    assert not impossible, f"outcomes of probability 0 occurred: {impossible[:5]}"
    big = [o for o, pr in law.items() if pr * draws >= 5]
    small = [o for o, pr in law.items() if 0 < pr * draws < 5]
    observed = [counts.get(o, 0) for o in big]
    expected = [law[o] * draws for o in big]
    if small:
        observed.append(sum(counts.get(o, 0) for o in small))
        expected.append(sum(law[o] for o in small) * draws)
    if len(observed) < 2:                 # a certain outcome: nothing left to test
        return
    expected = np.array(expected) * (draws / sum(expected))
    result = chisquare(observed, expected)
    assert result.pvalue > ALPHA, f"chi-square p = {result.pvalue:.2e}"


# ---------------------------------------------------------------- process_logits

def reference_probs(logits, temperature, top_k=0, top_p=1.0):
    """One row, float64, written the obvious way: sort, cut, renormalise (ties kept)."""
    x = np.asarray(logits, dtype=np.float64) / temperature
    if 0 < top_k < len(x):
        kth = np.sort(x)[::-1][top_k - 1]
        x = np.where(x >= kth, x, -np.inf)
    p = np.exp(x - x.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        total = 0.0
        for count, i in enumerate(order, start=1):
            total += p[i]
            if total >= top_p:
                break
        p = np.where(p >= p[order[count - 1]], p, 0.0)
        p /= p.sum()
    return p


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_temperature_only_is_softmax_and_float32(dtype):
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1)).to(dtype)
    for temperature in (0.3, 1.0, 2.5):
        probs = process_logits(logits, temperature)
        assert probs.dtype == torch.float32 and probs.shape == logits.shape
        for row in range(3):
            want = reference_probs(logits[row].double().numpy(), temperature)
            np.testing.assert_allclose(probs[row].numpy(), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("top_k,top_p", [(1, 1.0), (5, 1.0), (39, 1.0), (40, 1.0), (500, 1.0),
                                         (0, 0.5), (0, 0.9), (0, 0.999), (0, 1e-9),
                                         (5, 0.6), (20, 0.95)])
def test_top_k_top_p_match_reference(top_k, top_p):
    gen = torch.Generator().manual_seed(top_k * 1000 + int(top_p * 1000))
    logits = torch.randn(6, 40, generator=gen) * 2.0
    probs = process_logits(logits, 0.8, top_k, top_p)
    for row in range(6):
        want = reference_probs(logits[row].numpy(), 0.8, top_k, top_p)
        np.testing.assert_allclose(probs[row].numpy(), want, rtol=1e-5, atol=1e-7)
        assert ((probs[row] > 0) == torch.from_numpy(want > 0)).all()
        assert abs(float(probs[row].sum()) - 1.0) < 1e-5


def test_single_row_shape():
    logits = torch.randn(30, generator=torch.Generator().manual_seed(2))
    probs = process_logits(logits, 1.3, 7, 0.8)
    assert probs.shape == (30,) and probs.dtype == torch.float32
    np.testing.assert_allclose(probs.numpy(), reference_probs(logits.numpy(), 1.3, 7, 0.8),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("vocab,scale,top_p", [(5000, 0.01, 0.9), (5000, 0.5, 0.3), (5000, 8.0, 0.9)])
def test_top_p_wide_vocab(vocab, scale, top_p):
    """Flat rows need more than the 256 most probable tokens (the full-sort path);
    peaked rows do not. Both must give the reference nucleus."""
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(3)) * scale
    probs = process_logits(logits, 1.0, 0, top_p)
    for row in range(2):
        want = reference_probs(logits[row].numpy(), 1.0, 0, top_p)
        assert ((probs[row] > 0) == torch.from_numpy(want > 0)).all()
        np.testing.assert_allclose(probs[row].numpy(), want, rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("top_p", [0.3, 0.75, 0.95, 0.999999])
def test_top_p_wide_vocab_with_many_ties(top_p):
    """Logits on a coarse grid: thousands of exact ties, nuclei far beyond 256 tokens."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.round(torch.randn(3, 3000, generator=gen) * 2) / 4
    probs = process_logits(logits, 1.0, 0, top_p)
    for row in range(3):
        want = reference_probs(logits[row].numpy(), 1.0, 0, top_p)
        assert ((probs[row] > 0) == torch.from_numpy(want > 0)).all()
        np.testing.assert_allclose(probs[row].numpy(), want, rtol=1e-4, atol=1e-9)


def test_ties_are_kept_whole():
    logits = torch.tensor([1.0, 3.0, 3.0, 0.0, 2.0])
    np.testing.assert_allclose(process_logits(logits, 1.0, top_k=1).numpy(), [0, .5, .5, 0, 0])
    kept = process_logits(logits, 1.0, top_k=3)
    assert (kept > 0).tolist() == [False, True, True, False, True]
    # Uniform row: the nucleus for 0.5 is "two of four", but no two are more probable.
    np.testing.assert_allclose(process_logits(torch.zeros(4), 1.0, top_p=0.5).numpy(), [.25] * 4)


def test_at_least_one_token_survives():
    logits = torch.tensor([[0.0, 5.0, 1.0], [-1e4, -1e4 + 1, -1e4]])
    probs = process_logits(logits, 0.05, top_k=1, top_p=1e-12)
    assert probs.tolist() == [[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]


@pytest.mark.parametrize("kwargs", [dict(temperature=0.0), dict(temperature=-1.0),
                                    dict(temperature=float("nan")), dict(temperature=1.0, top_k=-1),
                                    dict(temperature=1.0, top_p=0.0), dict(temperature=1.0, top_p=1.5)])
def test_bad_parameters_raise(kwargs):
    with pytest.raises(RedwoodError):
        process_logits(torch.zeros(4), **kwargs)


# ---------------------------------------------------------------- children

def sequential_law(q, k):
    """Exact law of the ordered k-tuple of sequential sampling without replacement from q,
    continuing uniformly over unproposed tokens once q's remaining mass is 0."""
    q = np.asarray(q, dtype=np.float64)
    law = {}
    for combo in itertools.permutations(range(len(q)), k):
        prob, taken = 1.0, np.zeros(len(q), dtype=bool)
        for x in combo:
            rest = np.where(taken, 0.0, q)
            step = rest / rest.sum() if rest.sum() > 0 else (~taken) / (~taken).sum()
            prob *= step[x]
            taken[x] = True
        if prob > 0:
            law[combo] = prob
    return law


def draw_rows(q, k, replacement, draws, seed):
    gen = torch.Generator().manual_seed(seed)
    q32 = torch.tensor(q, dtype=torch.float32)
    tokens = propose_children(q32.expand(draws, -1), k, replacement, gen)
    assert tokens.shape == (draws, k) and tokens.dtype == torch.long
    return Counter(map(tuple, tokens.tolist()))


@pytest.fixture(params=[64, 1], ids=["head64", "head1"])
def head_width(request, monkeypatch):
    """Children are drawn from the most probable HEAD_WIDTH tokens plus a separately
    handled tail in blocks; small widths send most draws through the tail code, and
    blocks of 2 tokens make the tail span several blocks."""
    monkeypatch.setattr(sampling, "HEAD_WIDTH", request.param)
    if request.param < 8:
        monkeypatch.setattr(sampling, "TAIL_BLOCK", 2)
    return request.param


def draw_count(head_width):
    return 30000 if head_width >= 8 else 5000        # tail draws run a Python loop per row


@pytest.mark.parametrize("q,k", [([0.5, 0.2, 0.15, 0.1, 0.05], 3),
                                 ([0.02, 0.9, 0.05, 0.03], 3),
                                 ([0.0, 0.6, 0.0, 0.3, 0.1], 2),
                                 ([3.0, 1.0, 1.0, 5.0], 4)])          # unnormalised is fine
def test_without_replacement_is_sequential_law(q, k, head_width):
    q32 = np.asarray(torch.tensor(q, dtype=torch.float32).double())
    draws = draw_count(head_width)
    counts = draw_rows(q, k, False, draws, seed=len(q) * 10 + k + head_width)
    assert_law(counts, sequential_law(q32, k), draws)


def test_draft_exhausted_fills_uniformly(head_width):
    """Support 2, four children: the support first (in sequential order), then two
    distinct tokens uniformly from the other four."""
    q = [0.0, 0.7, 0.0, 0.0, 0.3, 0.0]
    draws = draw_count(head_width)
    counts = draw_rows(q, 4, False, draws, seed=5 + head_width)
    assert all(len(set(row)) == 4 for row in counts)
    assert all(set(row[:2]) == {1, 4} for row in counts)
    assert_law(counts, sequential_law(q, 4), draws)


def test_more_children_than_vocabulary(head_width):
    q = [0.1, 0.0, 0.9]
    counts = draw_rows(q, 5, False, 3000, seed=6)
    for row in counts:
        assert set(row[:2]) == {0, 2} and row[2] == 1      # support, then the uniform fill
        assert set(row[3:]) <= {0, 1, 2}


def test_exhausted_on_a_real_sized_vocabulary(head_width):
    vocab = 151936
    q = torch.zeros(3, vocab)
    q[:, [10, 20]] = torch.tensor([0.25, 0.75])
    q[2, 30] = 1.0                                   # row 2: support 3
    tokens = propose_children(q, 6, False, torch.Generator().manual_seed(7))
    for row in tokens.tolist():
        assert len(set(row)) == 6 and all(0 <= t < vocab for t in row)
    assert set(tokens[0, :2].tolist()) == {10, 20}
    assert set(tokens[2, :3].tolist()) == {10, 20, 30}


@pytest.mark.parametrize("q,k", [([0.5, 0.3, 0.2], 2), ([0.1, 0.0, 0.6, 0.3], 3)])
def test_with_replacement_is_iid(q, k, head_width):
    q = np.asarray(q) / np.sum(q)
    law = {combo: float(np.prod(q[list(combo)]))
           for combo in itertools.product(range(len(q)), repeat=k)}
    draws = draw_count(head_width)
    assert_law(draw_rows(q.tolist(), k, True, draws, seed=8 + k + head_width), law, draws)


def test_same_seed_same_children():
    q = torch.softmax(torch.randn(4, 100, generator=torch.Generator().manual_seed(9)), -1)
    for replacement in (False, True):
        a = propose_children(q, 5, replacement, torch.Generator().manual_seed(11))
        b = propose_children(q, 5, replacement, torch.Generator().manual_seed(11))
        assert torch.equal(a, b)


def test_greedy_children_are_top_k_in_rank_order():
    logits = torch.tensor([[0.1, 2.0, -1.0, 3.0, 0.5], [5.0, 4.0, 3.0, 2.0, 1.0]])
    assert greedy_children(logits, 3).tolist() == [[3, 1, 4], [0, 1, 2]]
    padded = greedy_children(logits[:, :2], 3)
    assert padded.shape == (2, 3) and padded[:, :2].tolist() == [[1, 0], [0, 1]]


@pytest.mark.parametrize("block", [512, 2])
def test_sample_token_law(block, monkeypatch):
    """One token by inverse CDF; blocks of 2 send a 7-token row through the block path."""
    monkeypatch.setattr(sampling, "TAIL_BLOCK", block)
    p = torch.tensor([0.0, 2.0, 0.5, 0.0, 1.0, 0.25, 0.25])         # unnormalised, zeros
    gen = torch.Generator().manual_seed(12)
    draws = 6000
    counts = Counter(sample_token(p, gen) for _ in range(draws))
    law = {i: float(x) / float(p.sum()) for i, x in enumerate(p)}
    assert_law(counts, law, draws)
