"""Calibration recovers known acceptance vectors: draft = target (p = [1, 0, ...]) and a draft
with a perturbed head, where the exact law of the accepted rank is computed from the two
models' distributions for a one-step horizon and compared by chi-square."""
import copy
import json

import numpy as np
import pytest
import torch
from scipy import stats

from redwood.measure.calibrate import calibrate, calibration_prompts
from redwood.cli.main import main
from redwood.errors import RedwoodError
from redwood.plan.formats import Acceptance, ConfidenceBins
from redwood.models.tiny_random import perturbed_copy, random_prompts, tiny_model

VOCAB = 48


@pytest.fixture(scope="module")
def target64():
    """float64, so draft = target agree to ~1e-15 and no rejection is numerical noise."""
    return tiny_model(vocab_size=VOCAB, seed=3, scale=2.0, dtype=torch.float64)


@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.0])
def test_draft_equal_to_target_accepts_rank_one_always(target64, temperature):
    draft = copy.deepcopy(target64)
    result = calibrate(target64, draft, random_prompts(4, VOCAB), temperature, width=6,
                       max_new_tokens=20, seed=1, progress=False, stop_on_eos=False)
    assert result.steps >= 10                       # each step yields 2 tokens: ~10 per prompt
    assert result.p.tolist() == [1.0, 0, 0, 0, 0, 0]
    assert result.extra["rejected"] == 0 and result.extra["counts"][0] == result.steps
    assert result.extra["tokens"] == 4 * 20


def _next_token_laws(model, prompts, temperature):
    """[N, V] float64: the model's processed next-token law after each full prompt."""
    with torch.no_grad():
        rows = [model(input_ids=p[None]).logits[0, -1] for p in prompts]
    return torch.softmax(torch.stack(rows).double() / temperature, dim=-1)


def _exact_rank_law(p, q, replacement):
    """[N, 3]: P(rank 1 accepted), P(rank 2 accepted), P(otherwise), per prompt, for the
    first two children drawn from q (with or without replacement) and verified against p
    by the residual rule."""
    first = torch.minimum(p, q).sum(-1)                                # sum_x min(p, q)
    residual = (p - q).clamp(min=0)
    residual = residual / residual.sum(-1, keepdim=True)               # r, the law after a rejection
    if replacement:                                                    # x2 ~ q again
        second = (1 - first) * torch.minimum(residual, q).sum(-1)
    else:                       # x2 ~ q without x1; x1 rejected w.p. q(x1) (1 - min(1, p/q))
        reject_x1 = q * (1 - torch.minimum(torch.ones_like(p), p / q))  # [N, V]
        q_without = q[:, None, :].repeat(1, q.shape[1], 1)              # [N, x1, V]
        q_without.diagonal(dim1=1, dim2=2).zero_()
        q_without = q_without / q_without.sum(-1, keepdim=True)
        accept_second = torch.minimum(residual[:, None, :], q_without).sum(-1)   # [N, x1]
        second = (reject_x1 * accept_second).sum(-1)
    return torch.stack([first, second, 1 - first - second], dim=-1)


@pytest.mark.parametrize("method", ["sequoia", "specinfer"])
def test_perturbed_draft_matches_exact_one_step_law(target64, method):
    draft = perturbed_copy(target64, noise=4.0, seed=5)
    prompts = random_prompts(200, VOCAB, length=6, seed=11)
    temperature = 0.8
    result = calibrate(target64, draft, prompts, temperature, method=method, width=4,
                       max_new_tokens=1, seed=2, progress=False)
    assert result.steps == len(prompts)             # one step per prompt: contexts are fixed
    exact = _exact_rank_law(_next_token_laws(target64, prompts, temperature),
                            _next_token_laws(draft, prompts, temperature),
                            replacement=method == "specinfer")
    expected = exact.sum(0).numpy()                 # expected counts over the prompts
    counts = np.array(result.extra["counts"])
    observed = np.array([counts[0], counts[1], result.steps - counts[0] - counts[1]])
    assert 0.3 < expected[0] / result.steps < 0.9   # the perturbation is neither tiny nor total
    assert expected[1] > 12
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    np.testing.assert_allclose(result.p, counts / result.steps)


def test_greedy_ranks_equal_the_exact_position_of_the_target_argmax(target64):
    draft = perturbed_copy(target64, noise=1.0, seed=7)
    prompts = random_prompts(120, VOCAB, length=5, seed=13)
    width = 5
    result = calibrate(target64, draft, prompts, 0.0, width=width, max_new_tokens=1,
                       progress=False)
    with torch.no_grad():
        best = torch.stack([target64(input_ids=p[None]).logits[0, -1] for p in prompts]).argmax(-1)
        top = torch.stack([draft(input_ids=p[None]).logits[0, -1] for p in prompts]).topk(width).indices
    hit = top == best[:, None]                                          # [N, width]
    expected = hit.sum(0).tolist()
    assert result.extra["counts"] == expected
    assert result.extra["rejected"] == int((~hit.any(-1)).sum())
    assert 0 < expected[0] < len(prompts)


def test_result_fields_and_file_round_trip(tmp_path, target64):
    draft = perturbed_copy(target64, noise=0.5)
    result = calibrate(target64, draft, random_prompts(3, VOCAB), 1.0, top_p=0.9, top_k=20,
                       width=3, max_new_tokens=8, progress=False, dataset="unit")
    loaded = Acceptance.load(result.save(tmp_path / "a.json"))
    assert loaded.p.tolist() == result.p.tolist() and len(loaded.p) == 3
    assert (loaded.temperature, loaded.top_p, loaded.top_k, loaded.dataset) == (1.0, 0.9, 20, "unit")
    assert sum(loaded.extra["counts"]) + loaded.extra["rejected"] == loaded.steps
    assert loaded.extra["method"] == "sequoia" and loaded.extra["width"] == 3


@pytest.mark.parametrize("kwargs, message", [
    ({"method": "chain"}, "calibration method"),
    ({"width": 0}, "width"),
    ({"temperature": -1.0}, "temperature"),
    ({"prompts": []}, "at least one prompt"),
    ({"prompts": [torch.tensor([3, VOCAB + 5])]}, "outside"),
])
def test_bad_arguments_raise_clear_errors(target64, kwargs, message):
    args = {"prompts": random_prompts(1, VOCAB), "temperature": 0.0, **kwargs}
    with pytest.raises(RedwoodError, match=message):
        calibrate(target64, target64, progress=False, **args)


class _WordTokenizer:
    """Stands in for a HF tokenizer: one id per character."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + ord(c) % 40 for c in text]}


def test_prompt_file_is_read_and_malformed_lines_are_named(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "def f():"}\n\n{"prompt": "x = 1"}\n{"prompt": "y"}\n')
    prompts, label = calibration_prompts(_WordTokenizer(), str(good), count=2)
    assert [p.tolist() for p in prompts] == [[2 + ord(c) % 40 for c in "def f():"],
                                             [2 + ord(c) % 40 for c in "x = 1"]]
    assert "good.jsonl" in label and "first 2" in label
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt key"}\n')
    with pytest.raises(RedwoodError, match=r"bad.jsonl:2"):
        calibration_prompts(_WordTokenizer(), str(bad))


def test_cli_quick_calibrate_writes_vector_and_plot(tmp_path, capsys):
    out, plot = tmp_path / "a.json", tmp_path / "a.png"
    rc = main(["calibrate", "--quick", "--temperature", "0.6", "--width", "4",
               "--num-prompts", "3", "--max-new-tokens", "10", "--out", str(out),
               "--plot", str(plot)])
    assert rc == 0
    acceptance = Acceptance.load(out)
    assert len(acceptance.p) == 4 and acceptance.temperature == 0.6 and acceptance.steps > 0
    assert json.loads(out.read_text())["prompts"] == 3
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert "p = [" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--prompts", "{bad}"], "bad.jsonl:1"),
    (["--prompts", "{missing}"], "does not exist"),
    (["--temperature", "-0.5"], "temperature"),
    (["--width", "0"], "width"),
    (["--tree", "t.json"], "--tree does not apply"),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    argv = [a.format(bad=bad, missing=tmp_path / "none.jsonl") for a in argv]
    rc = main(["calibrate", "--quick", "--out", str(tmp_path / "a.json"), *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_int8_quantised_draft_calibrates(target64):
    from redwood.models.cpu_kernels import quantize_int8

    draft = quantize_int8(copy.deepcopy(target64))          # converts to float32, then int8
    target32 = copy.deepcopy(target64).float()
    result = calibrate(target32, draft, random_prompts(3, VOCAB), 0.0, width=4,
                       max_new_tokens=8, progress=False)
    assert result.steps > 0 and 0 < result.p[0] <= 1


def test_confidence_bins_count_every_examined_child(target64, tmp_path):
    """Each step examines ranks 1..the accepted one (all `width` when none is accepted):
    the bins hold exactly those tokens, the accepted ones are the steps that accepted a
    child, every rate is a frequency; the file keeps them and old files read as None."""
    draft = perturbed_copy(target64, noise=1.5, seed=9)
    width = 4
    for temperature in (0.0, 0.8):
        result = calibrate(target64, draft, random_prompts(6, VOCAB, seed=17), temperature,
                           width=width, max_new_tokens=12, seed=3, progress=False,
                           stop_on_eos=False)
        bins = ConfidenceBins.of(Acceptance.load(result.save(tmp_path / "a.json")))
        counts, rejected = result.extra["counts"], result.extra["rejected"]
        assert sum(bins.drafted) == sum(k * c for k, c in enumerate(counts, 1)) + width * rejected
        assert sum(bins.accepted) == result.steps - rejected > 0
        assert rejected > 0                                  # some rejections were binned
        assert all(r is None or 0 <= r <= 1 for r in bins.rates)
        assert [r is None for r in bins.rates] == [d == 0 for d in bins.drafted]
    assert ConfidenceBins.of(Acceptance(p=[0.5])) is None


def test_confident_drafts_are_accepted_more_often(target64):
    """A draft that is the target with a flattened head (logits / 2): q ∝ sqrt(p), so a
    token's acceptance min(1, p/q) rises with q. One child per step at temperature 1: the
    observed per-bin counts follow the exact expectation, and high-confidence bins accept
    more often than the lowest."""
    target = tiny_model(vocab_size=VOCAB, seed=3, scale=40.0, dtype=torch.float64)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        draft.lm_head.weight.mul_(0.5)
    prompts = random_prompts(200, VOCAB, length=5, seed=21)
    result = calibrate(target, draft, prompts, 1.0, width=1, max_new_tokens=1, seed=4,
                       progress=False)
    bins = ConfidenceBins.of(result)
    p, q = _next_token_laws(target, prompts, 1.0), _next_token_laws(draft, prompts, 1.0)
    which = torch.bucketize(q, torch.tensor(bins.edges[1:-1], dtype=q.dtype), right=True)
    bins_n = len(bins.drafted)
    expected_drafted = torch.zeros(bins_n, dtype=q.dtype).index_add_(0, which.flatten(), q.flatten())
    expected_accepted = torch.zeros(bins_n, dtype=q.dtype).index_add_(
        0, which.flatten(), torch.minimum(p, q).flatten())
    for b in range(bins_n):                                  # within 4 binomial sd (+1) of exact
        for observed, expected in ((bins.drafted[b], expected_drafted[b]),
                                   (bins.accepted[b], expected_accepted[b])):
            sd = float(expected * (1 - expected / len(prompts))) ** 0.5
            assert abs(observed - float(expected)) <= 4 * sd + 1, (b, observed, float(expected))
    low = bins.rates[0]
    high = sum(bins.accepted[1:]) / sum(bins.drafted[1:])
    assert bins.drafted[0] > 30 and sum(bins.drafted[1:]) > 30
    assert low < 0.6 < 0.85 < high


def test_confidence_bins_reject_inconsistent_counts():
    ok = ConfidenceBins.empty([0.0, 0.25, 0.5, 0.75, 1.0])
    for probability, accepted in ((0.0, True), (0.5, False), (1.0, True)):
        ok.add(probability, accepted)
    assert (ok.drafted, ok.accepted) == ([1, 0, 1, 1], [1, 0, 0, 1])
    assert ConfidenceBins.from_dict(ok.to_dict()) == ok
    for bad in ({**ok.to_dict(), "accepted": [2, 0, 0, 1]},
                {**ok.to_dict(), "drafted": [1, 1]},
                {**ok.to_dict(), "edges": [0.0, 0.5, 0.4, 0.9, 1.0]},
                {"edges": [0.0, 1.0]}):
        with pytest.raises(RedwoodError, match="confidence_bins"):
            ConfidenceBins.from_dict(bad)
