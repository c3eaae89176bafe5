"""The hybrid drafter (decode/hybrid_drafter.py): n-gram point masses and draft-model children in
one tree. Greedy output equals plain greedy on both backends, sampling is exact (chi-square),
merged trees have no duplicate siblings, and the cost model keeps the draft model off where it
does not pay."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from redwood.decode.engine import Engine
from redwood.decode.hybrid_drafter import (HybridDrafter, hybrid_budget_tree, hybrid_drafting,
                                           limits_tree)
from redwood.decode.ngram_trees import ngram_budget_tree
from redwood.errors import RedwoodError
from redwood.plan.formats import Profile
from redwood.plan.tree import Tree
from test_ngram import LLAMA_PROMPTS, NGRAM_PROMPT, repeated_prompt
from tiny import tiny_model
from tiny_gguf import tiny_gguf_pair  # noqa: F401  (session fixture)

MODEL_TREE = Tree([-1, 0, 0, 1, 1, 2, 3])
# Every size costs the same and the draft is nearly free: the model always runs and every
# useful n-gram node is grafted (both sources are exercised).
FLAT = Profile({n: 10.0 for n in range(1, 65)}, {w: 0.01 for w in range(1, 65)})
# A steep target and a draft level costing as much as a target token (llama.cpp on a CPU).
STEEP = Profile({1: 30.0, 2: 50.0, 3: 65.0, 4: 80.0, 8: 170.0, 16: 340.0, 32: 700.0},
                {w: 30.0 for w in (1, 2, 4, 8, 16, 32)})


def hybrid_engine(target, draft, profile=FLAT, model_tokens=2.0, tree=MODEL_TREE):
    engine = Engine(target, draft, tree)
    engine.drafter, engine.tree = hybrid_drafting(engine, lambda t: (tree, model_tokens), profile)
    return engine


def record_proposals(drafter: HybridDrafter) -> list:
    """Wrap propose to keep every proposal (tree, tokens, sources)."""
    seen, inner = [], drafter.propose

    def propose(*args, **kwargs):
        proposal = inner(*args, **kwargs)
        seen.append(proposal)
        return proposal
    drafter.propose = propose
    return seen


def leaves(tree: Tree) -> int:
    return sum(1 for kids in tree.children if not kids)


@pytest.mark.parametrize("nodes, width, depth", [(1, 1, 0), (5, 1, 4), (30, 8, 15), (12, 6, 3),
                                                 (40, 12, 15)])
def test_limits_tree_has_the_limits(nodes, width, depth):
    tree = limits_tree(nodes, width, depth)
    assert leaves(tree) == width and tree.num_levels - 1 == depth
    assert len(tree) == max(nodes, depth + width) or depth == 0


def test_budget_tree_bounds_every_plan_and_the_ngram_side():
    ngram, wide = ngram_budget_tree(), Tree([-1, 0, 0, 0, 0, 1])
    budget = hybrid_budget_tree([MODEL_TREE, wide], ngram)
    assert len(budget) == max(len(MODEL_TREE), len(wide)) + len(ngram) - 1
    assert leaves(budget) == max(leaves(MODEL_TREE), leaves(wide)) + leaves(ngram)
    assert budget.num_levels == max(MODEL_TREE.num_levels, ngram.num_levels)


def test_refuses_an_engine_without_draft_model():
    target = tiny_model("qwen2", vocab_size=32, seed=1)
    from redwood.decode.ngram_drafter import NgramDrafter
    engine = Engine(target, None, MODEL_TREE, drafter=NgramDrafter())
    with pytest.raises(RedwoodError, match="needs a draft model"):
        hybrid_drafting(engine, lambda t: (MODEL_TREE, 2.0), FLAT)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_equals_autoregressive_transformers_with_both_sources(arch):
    target = tiny_model(arch, vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    # the same weights: a draft that agrees with the target, so its children get accepted
    draft = tiny_model(arch, vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    engine = hybrid_engine(target, draft, model_tokens=3.0)
    proposals = record_proposals(engine.drafter)
    by_source = {"model": 0, "ngram": 0}
    for seed in range(3):
        prompt = repeated_prompt(seed, 96)
        reference = engine.generate(prompt, 40, method="autoregressive", stop_on_eos=False)
        result = engine.generate(prompt, 40, method="sequoia", stop_on_eos=False)
        assert result.tokens == reference.tokens, (arch, seed)
        for source, count in result.stats.accepted_by_source.items():
            by_source[source] += count
    assert by_source["model"] > 0 and by_source["ngram"] > 0, by_source
    for proposal in proposals:               # merged: no two siblings share a token (greedy)
        tree, tokens = proposal.layout.tree, proposal.tokens.tolist()
        for kids in tree.children:
            assert len({tokens[k] for k in kids}) == len(kids)
        assert proposal.point_mass.tolist() == [s == "ngram" for s in proposal.sources]


def test_greedy_equals_autoregressive_llamacpp(tiny_gguf_pair):
    pytest.importorskip("llama_cpp")
    from redwood.backends.llamacpp import LlamaCppBackend

    options = dict(n_ctx=512, n_seq_max=32, n_batch=64, n_threads=1)
    with LlamaCppBackend(tiny_gguf_pair[0], **options) as target, \
            LlamaCppBackend(tiny_gguf_pair[1], **options) as draft:
        engine = hybrid_engine(target, draft)
        for prompt in LLAMA_PROMPTS:          # no near-ties on these (test_ngram checks)
            reference = engine.generate(torch.tensor(prompt), 32, method="autoregressive",
                                        stop_on_eos=False)
            result = engine.generate(torch.tensor(prompt), 32, method="sequoia",
                                     stop_on_eos=False)
            assert result.tokens == reference.tokens, prompt
            # the draft model holds (in its cache, or pending to run) exactly the text the
            # drafter has committed (the n-gram index's stream)
            drafter = engine.drafter
            stream = drafter.ngram.index.tokens
            shared = min(len(stream) - len(prompt), len(result.tokens))   # the last step is cut
            assert stream[:len(prompt) + shared] == prompt + result.tokens[:shared]
            assert draft.cache_length() + len(drafter.model.pending) == len(stream)
            assert drafter.model.pending == stream[len(stream) - len(drafter.model.pending):]


def test_steep_costs_keep_the_model_off_but_probing():
    """With a draft level as dear as a target token and a weak prior, the model only runs
    as a probe every `probe_every` steps; the n-gram side still drafts."""
    target = tiny_model("qwen2", vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    draft = tiny_model("qwen2", vocab_size=96, seed=2, dtype=torch.float64, num_layers=1)
    engine = hybrid_engine(target, draft, profile=STEEP, model_tokens=1.2)
    prompt = repeated_prompt(0, 96)
    reference = engine.generate(prompt, 40, method="autoregressive", stop_on_eos=False)
    result = engine.generate(prompt, 40, method="sequoia", stop_on_eos=False)
    assert result.tokens == reference.tokens
    steps = engine.drafter.steps
    total = sum(steps.values())
    assert steps["model"] <= total // engine.drafter.probe_every + 1, steps
    assert steps["ngram"] > 0, steps


def test_prior_checks():
    target = tiny_model("qwen2", vocab_size=32, seed=1)
    engine = Engine(target, tiny_model("qwen2", vocab_size=32, seed=2), MODEL_TREE)
    engine.drafter, engine.tree = hybrid_drafting(engine, lambda t: (MODEL_TREE, 0.5), FLAT)
    with pytest.raises(RedwoodError, match="expected tokens per step"):
        engine.generate(torch.tensor([3, 4, 5]), 4, stop_on_eos=False)


@pytest.mark.slow
@pytest.mark.parametrize("temperature, top_p", [(0.6, 1.0), (1.0, 1.0), (1.0, 0.8)])
def test_first_two_tokens_follow_the_target_with_mixed_proposals(temperature, top_p):
    """Sampled model children and point masses in one tree (NGRAM_PROMPT makes the n-gram
    side propose two continuations below the root)."""
    from test_engine_exactness import ALPHA, SAMPLES, VOCAB, chi_square_pvalue, exact_joint

    target = tiny_model("qwen2", vocab_size=VOCAB, seed=21, hidden_size=16, num_layers=1, scale=3.0)
    draft = tiny_model("qwen2", vocab_size=VOCAB, seed=22, hidden_size=16, num_layers=1, scale=3.0)
    engine = hybrid_engine(target, draft, tree=Tree([-1, 0, 1]))
    proposals = record_proposals(engine.drafter)
    counts = np.zeros(VOCAB * VOCAB)
    for seed in range(SAMPLES):
        result = engine.generate(NGRAM_PROMPT, 2, temperature=temperature, top_p=top_p,
                                 seed=seed, stop_on_eos=False)
        counts[result.tokens[0] * VOCAB + result.tokens[1]] += 1
    mixed = sum(1 for p in proposals if {"model", "ngram"} <= set(p.sources))
    assert mixed > SAMPLES // 2, "proposals were rarely mixed: the test would not bite"
    pvalue = chi_square_pvalue(counts, exact_joint(target, temperature, top_p, NGRAM_PROMPT))
    assert pvalue > ALPHA, f"hybrid T={temperature} top_p={top_p}: p-value {pvalue:.2e}"


@pytest.mark.parametrize("backend", ["hf", "llamacpp"])
def test_auto_plans_free_drafts_only_where_no_model_tree_pays(backend):
    """`--drafter auto`: per temperature, the bundle's vector planned for this machine; on a
    machine where a draft level costs as much as a target token nothing pays ("ngram"), on
    one where drafting is nearly free the model's tree does ("hybrid")."""
    from redwood.measure.bundles import load_bundle, shipped_bundle_dir
    from redwood.measure.hybrid_plans import hybrid_plans

    bundle = load_bundle(shipped_bundle_dir(backend=backend))
    cheap = Profile({n: 30.0 + 0.5 * n for n in range(1, 33)}, {w: 0.5 for w in range(1, 33)})
    for temperature in (0.0, 0.6, 1.0):
        tree, tokens, mode = hybrid_plans(STEEP, bundle, auto=True)(temperature)
        assert mode == "ngram" and len(tree) > 1 and tokens >= 1.0     # best tree, still kept
        tree, tokens, mode = hybrid_plans(cheap, bundle, auto=True)(temperature)
        assert mode == "hybrid" and len(tree) > 1 and tokens > 1.0
        assert hybrid_plans(STEEP, bundle)(temperature)[2] == "hybrid"    # auto off
        recorded = bundle.entry(temperature).drafter                     # the tuning machine's
        assert hybrid_plans(cheap, bundle, auto=True, bundle_latencies=True)(temperature)[2] \
            == recorded == ("ngram" if backend == "llamacpp" else "hybrid")


def test_ngram_mode_never_runs_the_model():
    target = tiny_model("qwen2", vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    draft = tiny_model("qwen2", vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    engine = Engine(target, draft, MODEL_TREE)
    engine.drafter, engine.tree = hybrid_drafting(engine, lambda t: (MODEL_TREE, 5.0, "ngram"),
                                                  FLAT)
    prompt = repeated_prompt(1, 96)
    reference = engine.generate(prompt, 30, method="autoregressive", stop_on_eos=False)
    result = engine.generate(prompt, 30, method="sequoia", stop_on_eos=False)
    assert result.tokens == reference.tokens and result.stats.draft_forwards == 0
    assert engine.drafter.steps["model"] == 0 and set(result.stats.accepted_by_source) <= {"ngram"}


def test_a_budget_the_model_tree_does_not_fit_is_refused():
    target = tiny_model("qwen2", vocab_size=32, seed=1)
    engine = hybrid_engine(target, tiny_model("qwen2", vocab_size=32, seed=2))
    with pytest.raises(RedwoodError, match="does not fit the request's tree budget"):
        engine.generate(torch.tensor([3, 4, 5]), 4, method="chain", stop_on_eos=False)


@pytest.mark.parametrize("mode", ["ngram", "hybrid"])
def test_draft_model_prefills_only_when_the_plan_uses_it(mode):
    """`--drafter auto` on a machine where no model tree pays plans "ngram": the draft model
    then never runs, not even its prefill; in "hybrid" it prefills once, lazily: at its first
    tree, the prompt and whatever the n-gram side had accepted before."""
    target = tiny_model("qwen2", vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    draft = tiny_model("qwen2", vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    engine = Engine(target, draft, profile=FLAT, live_costs=False)
    engine.drafter, engine.tree = hybrid_drafting(engine, lambda t: (MODEL_TREE, 2.0, mode), FLAT)
    prefills = []
    original = engine.drafter.model.prefill
    engine.drafter.model.prefill = lambda ids: (prefills.append(list(ids.tolist())), original(ids))
    prompt = torch.tensor([5, 6, 7, 8, 5, 6, 7])
    result = engine.generate(prompt, 24, stop_on_eos=False)
    reference = Engine(target, draft, MODEL_TREE).generate(prompt, 24, method="autoregressive",
                                                           stop_on_eos=False)
    assert result.tokens == reference.tokens
    if mode == "ngram":
        assert prefills == []
    else:
        stream = prompt.tolist() + result.tokens            # roots included
        assert len(prefills) == 1 and len(prompt) - 1 <= len(prefills[0]) < len(stream)
        assert prefills[0] == stream[:len(prefills[0])]
    assert (result.stats.accepted_by_source.get("model", 0) > 0) == (mode == "hybrid")
