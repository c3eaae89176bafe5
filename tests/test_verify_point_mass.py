"""Point-mass proposals (deterministic drafters such as n-gram lookup) keep verify_tree exact:
q = δ_x accepts x with probability p(x) and leaves the residual p without x. Checked by
chi-square against the exact target law, alone and mixed with sampled children at the
same node (docs/design.md §4.5)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from redwood.decode.sampling import process_logits, propose_children
from redwood.decode.verify import verify_tree
from redwood.plan.tree import Tree
from test_verify import TWO_LEVEL_TREES, assert_law, bigram_tables, f32, law_of


def lookup(token: int, j: int, vocab: int) -> int:
    """A fixed deterministic proposal: the j-th 'continuation' of `token`."""
    return (3 * token + 2 * j + 1) % vocab


def draft_mixed(tree, root, draft, point_children, replacement, gen):
    """tokens [n] and point_mass [n] for one tree: at every node the first
    `point_children` children are deterministic lookups, the rest sampled from the draft."""
    n, vocab = len(tree), draft.shape[-1]
    tokens = torch.empty(n, dtype=torch.long)
    point = torch.zeros(n, dtype=torch.bool)
    tokens[0] = root
    for level in tree.levels[:-1]:
        for u in (int(v) for v in level):
            kids = tree.children[u]
            if not kids:
                continue
            fixed = min(point_children, len(kids))
            for j, kid in enumerate(kids[:fixed]):
                tokens[kid], point[kid] = lookup(int(tokens[u]), j, vocab), True
            if len(kids) > fixed:
                sampled = propose_children(draft[tokens[u]][None], len(kids) - fixed, replacement, gen)
                tokens[kids[fixed:]] = sampled[0]
    return tokens, point


def first_two(tree, target, draft, point_children, replacement, gen, draws):
    out = []
    for _ in range(draws):
        emitted, root = [], 0
        while len(emitted) < 2:
            tokens, point = draft_mixed(tree, root, draft, point_children, replacement, gen)
            path, bonus = verify_tree(target[tokens], draft[tokens], tokens, tree, replacement,
                                      gen, point_mass=point)
            emitted += tokens[path[1:]].tolist() + [bonus]
            root = emitted[-1]
        out.append(tuple(emitted[:2]))
    return out


@pytest.mark.parametrize("width", [1, 3, 6])
def test_point_mass_star_emits_the_target_law(width):
    vocab = 5
    p = f32(np.random.default_rng(width).dirichlet(np.ones(vocab)))
    tree = Tree([-1] + [0] * width)
    gen = torch.Generator().manual_seed(width)
    tokens = torch.tensor([4] + [lookup(4, j, vocab) for j in range(width)])
    point = torch.ones(len(tree), dtype=torch.bool)
    draws = 6000
    counts = Counter()
    for _ in range(draws):
        path, bonus = verify_tree(p.expand(len(tree), -1), None, tokens, tree, False, gen,
                                  point_mass=point)
        counts[(tokens[path[1:]].tolist() + [bonus])[0]] += 1
    exact = law_of(p)
    assert_law(counts, {y: exact[y] for y in range(vocab)}, draws)


@pytest.mark.parametrize("shape,point_children,replacement,kind", [
    ("wide", 3, False, "random"),          # point masses only
    ("deep", 2, False, "random"),          # point masses only, deeper
    ("wide", 1, False, "random"),          # mixed: one lookup, then draft samples
    ("wide", 1, True, "truncated"),        # mixed, i.i.d. draft samples, exhausted drafts
    ("deep", 1, False, "zeros"),           # mixed, target zeros and one-hot drafts
])
def test_point_mass_and_mixed_trees_joint_of_first_two_tokens(shape, point_children,
                                                               replacement, kind):
    vocab = 5
    rng = np.random.default_rng(len(shape) * 10 + point_children)
    target, draft = bigram_tables(vocab, rng, kind)
    tree = Tree(TWO_LEVEL_TREES[shape])
    gen = torch.Generator().manual_seed(point_children + 7)
    exact = law_of(target)
    law = {(a, b): exact[0, a] * exact[a, b] for a in range(vocab) for b in range(vocab)}
    draws = 3000
    counts = Counter(first_two(tree, target, draft, point_children, replacement, gen, draws))
    assert_law(counts, law, draws)


@pytest.mark.parametrize("temperature,top_p", [(0.6, 1.0), (1.0, 1.0), (1.0, 0.8)])
def test_point_mass_exact_under_processed_target(temperature, top_p):
    """Sampling settings apply to p before verification; a lookup of a token that top-p
    removed is always rejected, and the output follows the processed law."""
    vocab = 6
    logits = torch.tensor(np.random.default_rng(3).normal(size=vocab) * 2, dtype=torch.float32)
    p = process_logits(logits[None], temperature, 0, top_p)[0]
    tree = Tree([-1, 0, 0, 0])
    tokens = torch.tensor([0, int(p.argmin()), int(p.argmax()), 2])
    point = torch.ones(4, dtype=torch.bool)
    gen = torch.Generator().manual_seed(11)
    draws = 6000
    counts = Counter()
    for _ in range(draws):
        path, bonus = verify_tree(p.expand(4, -1), None, tokens, tree, False, gen, point_mass=point)
        counts[(tokens[path[1:]].tolist() + [bonus])[0]] += 1
    exact = law_of(p)
    assert_law(counts, {y: exact[y] for y in range(vocab)}, draws)
