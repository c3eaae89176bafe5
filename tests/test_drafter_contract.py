"""Contract tests every `Drafter` passes (one factory per implementation): proposals are
well-formed trees with their proposal law, and the drafter's state after commits equals a
fresh drafter prefilled with the same committed text."""
from __future__ import annotations

import time

import pytest
import torch

from redwood.backends.hf import HFBackend
from redwood.decode.draft_model import DraftModelDrafter
from redwood.decode.drafter import ChildChooser, Drafter
from redwood.decode.layout import TreeLayout
from redwood.decode.ngram_drafter import NgramDrafter
from redwood.plan.tree import Tree
from redwood.models.tiny_random import tiny_model

TREE = Tree([-1, 0, 0, 1, 1, 2, 3, 5])
VOCAB = 96
# Text with repeated spans, and roots drawn from it, so that text-based drafters (n-gram
# lookup) really propose trees here; a model drafter does not care.
PROMPT = [5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 8, 7, 5, 6]


def draft_model_drafter():
    return DraftModelDrafter(HFBackend(tiny_model(vocab_size=VOCAB, seed=3, scale=3.0)), time.perf_counter)


def ngram_drafter():
    # learn=False: the learned acceptance rates are state beyond the committed text (they size
    # proposals), so only with them frozen must the proposal equal a fresh drafter's.
    return NgramDrafter(learn=False)


# Overlaps PROMPT ("5 6 7", "5 6", "7", "9 5") with other continuations, so lookups merge
# the request's candidates with the memory's.
MEMORY_STREAM = [5, 6, 7, 10, 11, 5, 6, 12, 7, 13, 9, 5, 14, 8, 5, 6, 7, 8, 15]


def ngram_memory_drafter():
    # learn=False as above. Each call builds its own memory with the same stream, so a
    # fresh drafter sees the same memory as the one that ran the steps: the test's drafter
    # never finishes its request (a prefill or finish() would add it), so its memory is
    # unchanged and no sharing of one memory object is needed.
    from redwood.decode.ngram_memory import NgramMemory

    memory = NgramMemory(max_tokens=64)
    memory.add(MEMORY_STREAM)
    return NgramDrafter(learn=False, memory=memory)


def hybrid_drafter():
    # A flat profile and probe_every=0: the model drafts every step and every useful n-gram
    # node is grafted, so proposals depend on the committed text only (no live-rate state).
    from redwood.decode.hybrid_drafter import HybridDrafter
    from redwood.plan.formats import Profile

    flat = Profile({n: 10.0 for n in range(1, 33)}, {w: 0.01 for w in range(1, 33)})
    return HybridDrafter(draft_model_drafter(), NgramDrafter(target_ms=flat.target_ms, learn=False),
                         flat, lambda t: (Tree([-1, 0, 0, 1]), 2.0), probe_every=0)


def grown_drafter():
    # per-step trees grown best-first on gentle costs (decode/tree_growth.py)
    from redwood.decode.tree_growth import BestFirstGrowth

    drafter = draft_model_drafter()
    drafter.growth = BestFirstGrowth({n: 10.0 + 0.3 * n for n in range(1, 33)}, lambda w: 0.3)
    return drafter


FACTORIES = {"draft_model": draft_model_drafter, "ngram": ngram_drafter,
             "ngram_memory": ngram_memory_drafter, "hybrid": hybrid_drafter,
             "draft_model_grown": grown_drafter}


@pytest.fixture(params=list(FACTORIES))
def make_drafter(request):
    return FACTORIES[request.param]


def _chooser(greedy: bool, seed: int = 0):
    return ChildChooser(greedy, temperature=0.9, top_p=0.95, generator=torch.Generator().manual_seed(seed))


def _check_proposal(proposal, root, requested: Tree, greedy: bool):
    tree = proposal.layout.tree
    n = len(tree)
    assert 1 <= n <= len(requested)
    assert proposal.tokens.shape == (n,) and proposal.tokens.dtype == torch.long
    assert int(proposal.tokens[0]) == root
    assert all(0 <= t < VOCAB for t in proposal.tokens.tolist())
    point = proposal.point_mass
    assert point is None or (point.shape == (n,) and point.dtype == torch.bool)
    assert proposal.draft_forwards >= 0 and proposal.draft_seconds >= 0
    if point is not None:                           # point-mass siblings: distinct tokens
        for kids in tree.children:
            fixed = [int(proposal.tokens[k]) for k in kids if bool(point[k])]
            assert len(fixed) == len(set(fixed))
    sampled = [u for u in range(1, n) if point is None or not bool(point[u])]
    if greedy or not sampled:
        return
    probs = proposal.draft_probs
    assert probs is not None and probs.shape == (n, VOCAB) and probs.dtype == torch.float32
    for u in sampled:
        parent = tree.parents[u]
        row = probs[parent]
        assert abs(float(row.sum()) - 1.0) < 1e-4
        assert row[proposal.tokens[u]] > 0          # drafted from its parent's law


def test_is_a_drafter(make_drafter):
    assert isinstance(make_drafter(), Drafter)


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("confidence", [0.0, 0.5])
def test_proposals_are_well_formed(make_drafter, greedy, confidence):
    drafter = make_drafter()
    layout = TreeLayout.build(TREE, "cpu")
    drafter.prefill(torch.tensor(PROMPT))
    root, chooser = 7, _chooser(greedy)
    for step in range(6):
        proposal = drafter.propose(root, layout, chooser, confidence)
        _check_proposal(proposal, root, TREE, greedy)
        tree = proposal.layout.tree
        path = [0]                                  # follow the first child, some steps
        while tree.children[path[-1]] and step % 2 == 0:
            path.append(tree.children[path[-1]][0])
        drafter.commit(path, proposal.tokens)
        root = PROMPT[(int(proposal.tokens[path[-1]]) + step) % len(PROMPT)]   # a "bonus" token


def test_state_after_commits_equals_fresh_prefill(make_drafter):
    """After steps with varied accepted paths (and plain steps, `skip`), the next greedy
    proposal equals that of a fresh drafter prefilled with the same committed text."""
    drafter = make_drafter()
    layout = TreeLayout.build(TREE, "cpu")
    text = list(PROMPT)
    drafter.prefill(torch.tensor(text))
    root, chooser = 7, _chooser(True)
    for step in range(7):
        if step % 3 == 2:                           # a plain target step (decode/governor.py)
            drafter.skip(root)
            text.append(root)
            root = PROMPT[(step * 3 + 1) % len(PROMPT)]
            continue
        proposal = drafter.propose(root, layout, chooser)
        tree = proposal.layout.tree
        path = [0]
        for _ in range(step % 4):                   # accept 0..3 levels
            kids = tree.children[path[-1]]
            if not kids:
                break
            path.append(kids[-1] if step % 2 else kids[0])
        drafter.commit(path, proposal.tokens)
        text += [root] + [int(proposal.tokens[u]) for u in path[1:]]
        root = PROMPT[(step * 5 + 2) % len(PROMPT)]
    fresh = make_drafter()
    fresh.prefill(torch.tensor(text))
    ours = drafter.propose(root, layout, chooser)
    theirs = fresh.propose(root, layout, _chooser(True))
    assert ours.tokens.tolist() == theirs.tokens.tolist()


def test_empty_prompt(make_drafter):
    drafter = make_drafter()
    drafter.prefill(torch.tensor([], dtype=torch.long))
    proposal = drafter.propose(3, TreeLayout.build(TREE, "cpu"), _chooser(True))
    _check_proposal(proposal, 3, TREE, True)
