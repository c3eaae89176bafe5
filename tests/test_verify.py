"""verify_tree is exact: whatever the draft, the tokens it emits follow the target law.
Checked by chi-square (alpha = 0.001) against exact laws on small vocabularies, with
children drawn by propose_children exactly as the engine draws them; plus an
independent exact enumeration, path validity, determinism, and verify_greedy."""
from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from redwood.decode.sampling import process_logits, propose_children
from redwood.plan.tree import Tree
from redwood.decode.verify import RESIDUAL_EPS, _TargetLaw, verify_greedy, verify_tree

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


def f32(x) -> torch.Tensor:
    """float32 tensor, renormalised in float32 (as process_logits leaves it)."""
    t = torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=torch.float32)
    return t / t.sum(dim=-1, keepdim=True)


def law_of(t: torch.Tensor) -> np.ndarray:
    """The exact law a float32 row stands for: its values in float64, normalised."""
    a = t.double().numpy()
    return a / a.sum(axis=-1, keepdims=True)


def star(width: int) -> Tree:
    return Tree([-1] + [0] * width)


# ---------------------------------------------------------------- an independent exact law

def star_outcomes(p, q, width, replacement):
    """Exact law of (rank of the accepted child or 0, first emitted token) for a star,
    by enumerating every proposal and accept/reject branch in float64."""
    vocab = len(p)
    out = Counter()

    def walk(cur, proposed, j, prob):
        if prob == 0.0:
            return
        if j == width:
            for y in np.nonzero(cur)[0]:
                out[(0, int(y))] += prob * cur[y]
            return
        if replacement:
            law = q / q.sum()
        else:
            free = np.ones(vocab, dtype=bool)
            free[list(proposed)] = False
            rest = np.where(free, q, 0.0)
            if rest.sum() > 0:
                law = rest / rest.sum()
            elif free.any():
                law = free / free.sum()
            else:                              # more children than tokens: repeats skipped
                walk(cur, proposed, j + 1, prob)
                return
        for x in np.nonzero(law)[0]:
            accept = min(1.0, cur[x] / law[x])
            if accept > 0.0:
                out[(j + 1, int(x))] += prob * law[x] * accept
            if accept < 1.0:
                residual = np.maximum(cur - law, 0.0)
                walk(residual / residual.sum(), proposed | {int(x)}, j + 1,
                     prob * law[x] * (1.0 - accept))

    walk(np.asarray(p, dtype=np.float64), frozenset(), 0, 1.0)
    return dict(out)


def run_star(p, q, width, replacement, draws, seed):
    """Outcomes (rank, first token) of `draws` verifications of a star over p, q."""
    gen = torch.Generator().manual_seed(seed)
    tree = star(width)
    children = propose_children(q.expand(draws, -1), width, replacement, gen)
    target = p.expand(width + 1, -1)           # children's rows are never read for token 1
    draft = q.expand(width + 1, -1)
    counts = Counter()
    for row in children:
        tokens = torch.cat([torch.zeros(1, dtype=torch.long), row])
        path, bonus = verify_tree(target, draft, tokens, tree, replacement, gen)
        if len(path) > 1:
            counts[(int(tree.ranks[path[1]]), int(tokens[path[1]]))] += 1
        else:
            counts[(0, bonus)] += 1
    return counts


def star_cases():
    rng = np.random.default_rng(20240219)
    d5 = lambda: rng.dirichlet(np.ones(5))
    peaked = np.array([0.97, 0.01, 0.01, 0.01, 0.0, 0.0])
    p_zeros = np.array([0.0, 0.4, 0.0, 0.35, 0.25, 0.0])
    shared = d5()
    return {
        "random": (d5(), d5()),
        "random_v8": (rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8) * 0.5)),
        "q_misses_p": (rng.dirichlet(np.ones(6)), np.array([0.5, 0.0, 0.3, 0.0, 0.2, 0.0])),
        "q_support_2": (rng.dirichlet(np.ones(6)), np.array([0.0, 0.0, 0.6, 0.0, 0.4, 0.0])),
        "p_equals_q": (shared, shared),
        "one_hot_same": (np.eye(4)[2], np.eye(4)[2]),
        "one_hot_apart": (np.eye(4)[1], np.eye(4)[3]),
        "peaked_q_p_zeros": (p_zeros, peaked),
        "p_zeros_q_full": (p_zeros, rng.dirichlet(np.ones(6))),
    }


STAR_RUNS = [  # (case, width, replacement)
    ("random", 1, False), ("random", 2, False), ("random", 3, False), ("random", 6, False),
    ("random", 3, True), ("random_v8", 4, False), ("random_v8", 9, False), ("random_v8", 4, True),
    ("q_misses_p", 2, False), ("q_misses_p", 2, True),
    ("q_support_2", 4, False), ("q_support_2", 7, False), ("q_support_2", 3, True),
    ("p_equals_q", 3, False), ("p_equals_q", 2, True),
    ("one_hot_same", 3, False), ("one_hot_same", 2, True),
    ("one_hot_apart", 2, False), ("one_hot_apart", 5, False), ("one_hot_apart", 2, True),
    ("peaked_q_p_zeros", 5, False), ("peaked_q_p_zeros", 3, True),
    ("p_zeros_q_full", 3, False), ("p_zeros_q_full", 3, True),
]


@pytest.mark.parametrize("case,width,replacement", STAR_RUNS)
def test_enumerated_star_law_emits_exactly_p(case, width, replacement):
    """The reference enumeration itself (no torch): its first-token marginal is p."""
    p, q = (law_of(f32(x)) for x in star_cases()[case])
    outcomes = star_outcomes(p, q, width, replacement)
    marginal = np.zeros(len(p))
    for (_, token), prob in outcomes.items():
        marginal[token] += prob
    np.testing.assert_allclose(marginal, p, atol=1e-12)


@pytest.mark.parametrize("case,width,replacement", STAR_RUNS)
def test_star_matches_exact_law(case, width, replacement):
    """verify_tree on a star: the joint law of (accepted rank, first token) equals the
    enumeration, hence the first token follows p."""
    p, q = (f32(x) for x in star_cases()[case])
    draws = 4000
    seed = 100 + STAR_RUNS.index((case, width, replacement))
    counts = run_star(p, q, width, replacement, draws, seed)
    law = star_outcomes(law_of(p), law_of(q), width, replacement)
    assert_law(counts, law, draws)
    first_token = Counter()
    for (_, token), n in counts.items():
        first_token[token] += n
    assert_law(first_token, dict(enumerate(law_of(p))), draws)


def test_star_width_2_over_3_tokens_by_hand():
    """Acceptance and rejection-path probabilities for a star of width 2 over V = 3,
    written out in exact fractions, against the enumeration and against verify_tree."""
    F = Fraction
    p = [F(1, 2), F(3, 10), F(1, 5)]
    q = [F(1, 5), F(3, 10), F(1, 2)]
    law = Counter()
    for a in range(3):                                     # first child a ~ q
        accept_a = min(F(1), p[a] / q[a])
        law[(1, a)] += q[a] * accept_a
        r = [max(p[i] - q[i], F(0)) for i in range(3)]     # residual after rejecting a
        r = [x / sum(r) for x in r] if accept_a < 1 else r
        for b in (i for i in range(3) if i != a):          # second child ~ q without a
            qb = q[b] / (1 - q[a])
            accept_b = min(F(1), r[b] / qb) if accept_a < 1 else F(0)
            reach = q[a] * (1 - accept_a) * qb
            law[(2, b)] += reach * accept_b
            q2 = [q[i] / (1 - q[a]) if i != a else F(0) for i in range(3)]
            r2 = [max(r[i] - q2[i], F(0)) for i in range(3)]
            if reach * (1 - accept_b) > 0:
                for y in range(3):
                    law[(0, y)] += reach * (1 - accept_b) * r2[y] / sum(r2)
    exact = {k: float(v) for k, v in law.items() if v > 0}
    # By hand: token 0 accepted at rank 1 w.p. q0 = 1/5; token 1 w.p. 3/10; token 2
    # w.p. 1/2 * (1/5)/(1/2) = 1/5; the residual after rejecting 2 is all on token 0.
    assert law[(1, 0)] == F(1, 5) and law[(1, 1)] == F(3, 10) and law[(1, 2)] == F(1, 5)
    for y in range(3):                                    # and the emitted token ~ p
        assert sum(v for (rank, tok), v in law.items() if tok == y) == p[y]
    enumerated = star_outcomes(np.array(p, dtype=float), np.array(q, dtype=float), 2, False)
    assert set(enumerated) == set(exact)
    for key, value in exact.items():
        assert enumerated[key] == pytest.approx(value, abs=1e-12)
    draws = 6000
    counts = run_star(f32([float(x) for x in p]), f32([float(x) for x in q]), 2, False, draws, 3)
    assert_law(counts, exact, draws)


# ---------------------------------------------------------------- two levels: a bigram model

def bigram_tables(vocab, rng, kind):
    """Target and draft next-token tables [V, V] (row = previous token)."""
    target = rng.dirichlet(np.ones(vocab), size=vocab)
    draft = rng.dirichlet(np.ones(vocab) * 0.7, size=vocab)
    if kind == "truncated":                      # top-k-like: draft support of 2 tokens
        cut = np.argsort(-draft, axis=1)[:, 2:]
        np.put_along_axis(draft, cut, 0.0, axis=1)
    if kind == "zeros":                          # target zeros and one-hot draft rows
        target[:, 0] = 0.0
        draft[1] = np.eye(vocab)[0]
        draft[2] = np.eye(vocab)[3]
    if kind == "same":
        draft = target.copy()
    return f32(target), f32(draft)


def draft_trees(tree, roots, draft, replacement, gen):
    """Node tokens [N, n] for N trees with root tokens roots [N], drawn level by level
    with one propose_children call per level, the way the engine drafts (the nodes of a
    level share k = the widest node's child count; each takes its first columns)."""
    tokens = torch.empty(len(roots), len(tree), dtype=torch.long)
    tokens[:, 0] = torch.as_tensor(roots)
    for level in tree.levels[:-1]:
        parents = [int(u) for u in level if tree.children[u]]
        if not parents:
            continue
        k = max(len(tree.children[u]) for u in parents)
        rows = draft[tokens[:, parents]].reshape(-1, draft.shape[-1])     # [N * P, V]
        kids = propose_children(rows, k, replacement, gen).view(len(roots), len(parents), k)
        for col, u in enumerate(parents):
            tokens[:, tree.children[u]] = kids[:, col, :len(tree.children[u])]
    return tokens


def first_two_tokens(tree, target, draft, replacement, gen, draws, root_token=0):
    """Emitted token pairs of `draws` independent generations, each running
    verification steps (a node's target row = target[its token], a bigram model) until
    two tokens are out. Trees of a round are drafted together."""
    emitted = [[] for _ in range(draws)]
    todo = list(range(draws))
    while todo:
        roots = [emitted[i][-1] if emitted[i] else root_token for i in todo]
        trees = draft_trees(tree, roots, draft, replacement, gen)
        for i, tokens in zip(todo, trees):
            path, bonus = verify_tree(target[tokens], draft[tokens], tokens, tree,
                                      replacement, gen)
            emitted[i] += tokens[path[1:]].tolist() + [bonus]
        todo = [i for i in todo if len(emitted[i]) < 2]
    return [tuple(e[:2]) for e in emitted]


TWO_LEVEL_TREES = {
    "wide": [-1, 0, 0, 0, 1, 1, 2],
    "deep": [-1, 0, 0, 1, 1, 2, 3, 4],
    "chain": [-1, 0, 1, 2],
}


@pytest.mark.parametrize("shape,kind,replacement,vocab", [
    ("wide", "random", False, 5), ("wide", "random", True, 5), ("deep", "truncated", False, 6),
    ("deep", "zeros", False, 4), ("deep", "zeros", True, 4), ("chain", "same", False, 4),
    ("wide", "truncated", True, 6),
])
def test_two_level_tree_joint_of_first_two_tokens(shape, kind, replacement, vocab):
    rng = np.random.default_rng(vocab * 100 + len(kind))
    target, draft = bigram_tables(vocab, rng, kind)
    tree = Tree(TWO_LEVEL_TREES[shape])
    gen = torch.Generator().manual_seed(vocab + len(shape))
    exact = law_of(target)
    law = {(a, b): exact[0, a] * exact[a, b] for a in range(vocab) for b in range(vocab)}
    draws = 4000
    counts = Counter(first_two_tokens(tree, target, draft, replacement, gen, draws))
    assert_law(counts, law, draws)


# ---------------------------------------------------------------- robustness

def random_tree(rng, size):
    parents = [-1]
    frontier = [0]
    while len(parents) < size:
        nxt = []
        for u in frontier:
            for _ in range(rng.integers(0, 4)):
                if len(parents) < size:
                    parents.append(u)
                    nxt.append(len(parents) - 1)
        frontier = nxt or [len(parents) - 1]
    return Tree(parents)


@pytest.mark.parametrize("replacement", [False, True])
def test_paths_valid_and_never_nan(replacement):
    rng = np.random.default_rng(7)
    gen = torch.Generator().manual_seed(7)
    vocab = 50
    for trial in range(60):
        tree = random_tree(rng, int(rng.integers(2, 20)))
        logits = torch.as_tensor(rng.normal(size=(2, len(tree), vocab)) * rng.choice([0.5, 3, 30]),
                                 dtype=torch.float32)
        target = process_logits(logits[0], 1.0, top_k=int(rng.choice([0, 1, 3])),
                                top_p=float(rng.choice([1.0, 0.5])))
        draft = process_logits(logits[1], 1.0, top_k=int(rng.choice([0, 2])))
        if trial % 5 == 0:
            draft = target.clone()
        tokens = torch.zeros(len(tree), dtype=torch.long)
        for u in range(len(tree)):
            if tree.children[u]:
                kids = propose_children(draft[u:u + 1], len(tree.children[u]), replacement, gen)
                tokens[tree.children[u]] = kids[0]
        path, bonus = verify_tree(target, draft, tokens, tree, replacement, gen)
        assert path[0] == 0 and isinstance(bonus, int) and 0 <= bonus < vocab
        for parent, child in zip(path, path[1:]):
            assert tree.parents[child] == parent
            assert target[parent, tokens[child]] > 0          # never emits a 0-prob token
        assert target[path[-1], bonus] > 0


def test_real_sized_vocabulary_and_equal_distributions():
    """V = 151,936, p == q (the residual is numerically empty after any rejection),
    and a one-hot target: valid paths, no NaN, the one-hot token always emitted."""
    gen = torch.Generator().manual_seed(1)
    vocab = 151936
    tree = Tree([-1, 0, 0, 0, 1, 1, 2, 4])
    logits = torch.randn(len(tree), vocab, generator=gen) * 4
    probs = process_logits(logits, 1.0)
    for replacement in (False, True):
        tokens = torch.zeros(len(tree), dtype=torch.long)
        for u in range(len(tree)):
            if tree.children[u]:
                tokens[tree.children[u]] = propose_children(
                    probs[u:u + 1], len(tree.children[u]), replacement, gen)[0]
        path, bonus = verify_tree(probs, probs, tokens, tree, replacement, gen)
        assert all(tree.parents[c] == u for u, c in zip(path, path[1:])) and 0 <= bonus < vocab
        one_hot = torch.zeros(len(tree), vocab)
        one_hot[:, 1234] = 1.0
        path, bonus = verify_tree(one_hot, probs, tokens, tree, replacement, gen)
        emitted = tokens[path[1:]].tolist() + [bonus]
        assert set(emitted) == {1234}


def test_residual_fallback_keeps_p_when_numerically_empty():
    p = f32([0.25, 0.25, 0.5])
    q = p * torch.tensor([1.0 + 1e-7, 1.0, 1.0 - 5e-8])
    assert 0 < float(torch.clamp(p - q, min=0).sum()) <= RESIDUAL_EPS
    target = _TargetLaw(p)
    target.replace(torch.clamp(p - q, min=0))
    assert torch.equal(target.p, p) and target.mass == pytest.approx(1.0)
    target.replace(torch.clamp(p - f32([0.5, 0.25, 0.25]), min=0))
    np.testing.assert_allclose((target.p / target.mass).numpy(), [0.0, 0.0, 1.0], atol=1e-7)


def test_same_seed_same_result():
    rng = np.random.default_rng(3)
    target, draft = bigram_tables(6, rng, "random")
    tree = Tree(TWO_LEVEL_TREES["deep"])
    for replacement in (False, True):
        runs = []
        for _ in range(2):
            gen = torch.Generator().manual_seed(99)
            runs.append(first_two_tokens(tree, target, draft, replacement, gen, 20))
        assert runs[0] == runs[1]
        assert len(set(runs[0])) > 1                      # and it is random at all


# ---------------------------------------------------------------- greedy

def test_verify_greedy_by_hand():
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    tree = Tree([-1, 0, 0, 1, 1, 2])
    tokens = torch.tensor([9, 5, 7, 2, 8, 4])
    argmax = torch.tensor([7, 2, 4, 0, 0, 6])   # root wants 7 (node 2), node 2 wants 4 (node 5)
    assert verify_greedy(argmax, tokens, tree) == ([0, 2, 5], 6)
    argmax = torch.tensor([5, 3, 4, 0, 0, 6])   # node 1 accepted, node 1 wants 3: no child
    assert verify_greedy(argmax, tokens, tree) == ([0, 1], 3)
    argmax = torch.tensor([1, 2, 4, 0, 0, 6])   # root wants 1: nothing accepted
    assert verify_greedy(argmax, tokens, tree) == ([0], 1)


def brute_force_greedy(argmax, tokens, tree):
    """Deepest node whose whole root path matches the argmaxes (siblings distinct)."""
    ok = [True] + [False] * (len(tree) - 1)
    for u in range(1, len(tree)):
        parent = tree.parents[u]
        ok[u] = ok[parent] and tokens[u] == argmax[parent]
    deepest = max((u for u in range(len(tree)) if ok[u]), key=lambda u: tree.depths[u])
    path = [deepest]
    while path[-1] != 0:
        path.append(tree.parents[path[-1]])
    return path[::-1], argmax[deepest]


def test_verify_greedy_matches_brute_force():
    rng = np.random.default_rng(11)
    vocab = 4
    for _ in range(300):
        tree = random_tree(rng, int(rng.integers(1, 25)))
        tokens = [0] * len(tree)
        for u in range(len(tree)):
            kids = tree.children[u]
            for kid, tok in zip(kids, rng.permutation(max(vocab, len(kids)))):
                tokens[kid] = int(tok)
        argmax = rng.integers(0, vocab, size=len(tree)).tolist()
        got = verify_greedy(torch.tensor(argmax), torch.tensor(tokens), tree)
        assert got == brute_force_greedy(argmax, tokens, tree)
