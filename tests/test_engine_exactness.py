"""The engine's output is distributed exactly as the target's: chi-square tests of the
joint law of the first two new tokens against the law enumerated from the target alone."""
import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from redwood.decode.engine import Engine
from redwood.decode.sampling import process_logits
from redwood.plan.tree import Tree
from tiny import tiny_model

pytestmark = pytest.mark.slow          # chi-square runs: ~1-2 min on 2 cores

VOCAB = 8
PROMPT = torch.tensor([3, 5, 2])
# Width 3 at the root, then narrower: exercises siblings, depth and the residual rule.
TREE = Tree([-1, 0, 0, 0, 1, 1, 2, 4])
SAMPLES = 1200
ALPHA = 1e-3


@pytest.fixture(scope="module")
def models():
    # Different seeds: the draft disagrees with the target often, so rejections,
    # residuals and bonus tokens are all exercised.
    target = tiny_model("qwen2", vocab_size=VOCAB, seed=21, hidden_size=16, num_layers=1, scale=3.0)
    draft = tiny_model("qwen2", vocab_size=VOCAB, seed=22, hidden_size=16, num_layers=1, scale=3.0)
    return target, draft


@torch.inference_mode()
def exact_joint(target, temperature, top_p, prompt=PROMPT):
    """P(first, second) for the target alone with the same processing: [V, V]."""
    first = process_logits(target(input_ids=prompt[None]).logits[0, -1], temperature, 0, top_p)
    joint = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    for token in range(VOCAB):
        if first[token] > 0:
            ids = torch.cat([prompt, torch.tensor([token])])[None]
            second = process_logits(target(input_ids=ids).logits[0, -1], temperature, 0, top_p)
            joint[token] = first[token].double() * second.double()
    return joint.numpy().ravel()


def chi_square_pvalue(counts, probs):
    """Pool cells with expected count < 5 so the chi-square approximation holds."""
    expected = probs / probs.sum() * counts.sum()
    small = expected < 5
    observed = np.append(counts[~small], counts[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    if expected[-1] < 1e-9:
        assert observed[-1] == 0, "a token with zero target probability was produced"
        observed, expected = observed[:-1], expected[:-1]
    expected *= observed.sum() / expected.sum()       # exact totals, as chisquare requires
    return chisquare(observed, expected).pvalue


@pytest.mark.parametrize("method", ["sequoia", "specinfer", "chain"])
@pytest.mark.parametrize("temperature, top_p", [(0.6, 1.0), (1.0, 1.0), (1.0, 0.8)])
def test_first_two_tokens_follow_the_target(models, method, temperature, top_p):
    target, draft = models
    engine = Engine(target, draft, TREE)
    counts = np.zeros(VOCAB * VOCAB)
    gained = 0
    for seed in range(SAMPLES):
        result = engine.generate(PROMPT, 2, temperature=temperature, top_p=top_p, seed=seed,
                                 method=method, stop_on_eos=False)
        counts[result.tokens[0] * VOCAB + result.tokens[1]] += 1
        gained += result.accepted[0]
    assert gained > SAMPLES * 1.2, "the draft never helped: the test would not exercise trees"
    pvalue = chi_square_pvalue(counts, exact_joint(target, temperature, top_p))
    assert pvalue > ALPHA, f"{method} T={temperature} top_p={top_p}: p-value {pvalue:.2e}"


# Thresholds chosen (per sampling law) so that pruning varies the tree from step to step.
@pytest.mark.parametrize("method, temperature, top_p, threshold", [
    ("sequoia", 1.0, 1.0, 0.15), ("sequoia", 0.6, 0.8, 0.2), ("specinfer", 1.0, 1.0, 0.15)])
def test_pruning_by_draft_confidence_stays_exact(models, method, temperature, top_p, threshold):
    """With draft_confidence the tree's shape depends on the draft's own probabilities;
    the output law must not move."""
    target, draft = models
    engine = Engine(target, draft, TREE)
    counts = np.zeros(VOCAB * VOCAB)
    sizes = set()
    for seed in range(SAMPLES):
        result = engine.generate(PROMPT, 2, temperature=temperature, top_p=top_p, seed=seed,
                                 method=method, stop_on_eos=False, draft_confidence=threshold)
        counts[result.tokens[0] * VOCAB + result.tokens[1]] += 1
        sizes.add(result.stats.tree_nodes)
    # Pruning must actually vary the tree (the full tree would always give 7 nodes a step).
    assert len(sizes) >= 3 and min(sizes) < 7, sizes
    pvalue = chi_square_pvalue(counts, exact_joint(target, temperature, top_p))
    assert pvalue > ALPHA, f"{method} pruned T={temperature} top_p={top_p}: p-value {pvalue:.2e}"
