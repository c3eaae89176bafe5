"""What the hybrid drafter (decode/hybrid_drafter.py) charges the draft model, and its n-gram side.

The model runs only where it pays on this request's costs: its steps are charged what its draft
forwards measurably took, the prompt's catch-up (the draft's prefill) is charged before its first
tree, a probe that loses doubles the wait for the next, and the n-gram side drafts as deep as
`--drafter ngram` does. Greedy output stays the target's in every case."""
from __future__ import annotations

import torch

from redwood.decode.engine import Engine
from redwood.decode.hybrid_drafter import hybrid_drafting
from redwood.decode.ngram_drafter import COPY_DEPTH
from redwood.decode.ngram_trees import ngram_budget_tree
from redwood.plan.formats import Profile
from redwood.plan.tree import Tree
from test_hybrid import record_proposals
from tiny import tiny_model

MODEL_TREE = Tree([-1, 0, 0, 1, 1, 2, 3])            # 3 levels deep, 2 draft forwards
# A flat target (30 ms at any size); draft forwards of up to 8 tokens cost 1 ms, wider ones
# 4 s per 16 tokens: a few pending tokens are free to catch up, a long prompt is not.
STEEP_CATCH_UP = Profile({n: 30.0 for n in range(1, 65)}, {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0,
                                                           16: 4000.0})
FLAT = Profile({n: 10.0 for n in range(1, 65)}, {w: 0.01 for w in range(1, 65)})


def target_model():
    return tiny_model("qwen2", vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)


def same_model_engine(profile: Profile, model_tokens: float = 4.0) -> Engine:
    """The draft is the target itself, so every drafted token is kept: the model's tree pays
    (4 tokens for ~32 ms against 1 for 30) wherever its costs allow."""
    engine = Engine(target_model(), target_model(), profile=profile, live_costs=False)
    engine.drafter, engine.tree = hybrid_drafting(
        engine, lambda t: (MODEL_TREE, model_tokens, "hybrid"), profile)
    return engine


def greedy_reference(prompt: torch.Tensor, n: int) -> list[int]:
    plain = Engine(target_model(), target_model(), MODEL_TREE)
    return plain.generate(prompt, n, method="autoregressive", stop_on_eos=False).tokens


def count_prefills(engine: Engine) -> list[int]:
    lengths, inner = [], engine.drafter.model.prefill
    engine.drafter.model.prefill = lambda ids: (lengths.append(len(ids)), inner(ids))
    return lengths


def test_a_long_prompt_catch_up_keeps_the_model_off_a_short_one_does_not():
    """The same costs and model: behind a 7-token prompt the draft catches up for free and
    drafts; behind 40 tokens its prefill (10 s, spread over CATCH_UP_STEPS steps) makes it
    slower than plain steps, so it never runs, not even its prefill."""
    generator = torch.Generator().manual_seed(3)
    for length, runs in ((7, True), (40, False)):
        engine = same_model_engine(STEEP_CATCH_UP)
        prefills = count_prefills(engine)
        prompt = torch.randint(2, 96, (length,), generator=generator)
        result = engine.generate(prompt, 24, stop_on_eos=False)
        assert result.tokens == greedy_reference(prompt, 24)
        steps = engine.drafter.steps
        if runs:
            # the prompt less its last token, the first root (the engine's fused prefill)
            assert prefills == [length - 1] and steps["model"] > sum(steps.values()) // 2, steps
        else:
            assert prefills == [] and steps["model"] == 0 and result.stats.draft_forwards == 0


def test_measured_model_steps_turn_it_off_and_losing_probes_back_off():
    """An injected clock makes every draft of the model take 500 ms (the profile says ~1):
    after its first tree the model's measured rate loses to plain steps, it runs only as a
    probe, and each losing probe doubles the wait. At the profile's cost it drafts every step."""
    prompt = torch.tensor([5, 6, 7, 8, 9])
    for slow in (False, True):
        engine = same_model_engine(FLAT)
        drafter = engine.drafter
        # no n-gram drafts: the tiny target's greedy text repeats itself, and copies of it
        # would take the steps this test watches (each step is the model's or a plain one)
        drafter.ngram.max_length = 0
        now = [0.0]
        drafter.clock = lambda: now[0]
        inner = drafter.model.propose

        def propose(*args, **kwargs):
            now[0] += 0.5 if slow else 0.001
            return inner(*args, **kwargs)
        drafter.model.propose = propose
        result = engine.generate(prompt, 80, stop_on_eos=False)
        assert result.tokens == greedy_reference(prompt, 80)
        steps = drafter.steps
        if slow:
            # the first tree, then probes after 8, 16 and 32 steps without it (at most)
            assert 2 <= steps["model"] <= 4 and drafter.probe_interval >= 4 * drafter.probe_every
        else:
            assert steps["model"] == sum(steps.values()), steps
            assert drafter.probe_interval == drafter.probe_every


def test_the_ngram_side_drafts_as_deep_as_the_ngram_drafter():
    """`--drafter auto` / `hybrid` copy as far as `--drafter ngram` does: chains of up to
    COPY_DEPTH tokens (they were cut at 8, and a whole-file edit kept ~5 tokens a step where
    the n-gram drafter kept ~19), and t(n) read at the request's context."""
    target = tiny_model("qwen2", vocab_size=96, seed=1, dtype=torch.float64, scale=4.0)
    draft = tiny_model("qwen2", vocab_size=96, seed=2, dtype=torch.float64)
    engine = Engine(target, draft, MODEL_TREE, profile=FLAT, live_costs=False)
    steep_model = Profile(FLAT.target_ms, {w: 500.0 for w in range(1, 65)},
                          target_ms_by_context={128: FLAT.target_ms, 1024: FLAT.target_ms})
    engine.drafter, engine.tree = hybrid_drafting(
        engine, lambda t: (MODEL_TREE, 1.5, "hybrid"), steep_model)
    ngram = engine.drafter.ngram
    assert ngram.max_length == COPY_DEPTH and ngram.target_ms_by_context is not None
    assert engine.tree.num_levels >= ngram_budget_tree(depth=COPY_DEPTH).num_levels
    generator = torch.Generator().manual_seed(0)
    span = torch.randint(2, 96, (30,), generator=generator)
    prompt = torch.cat([span, torch.tensor([1]), span[:4]])       # the span again, 26 to go
    proposals = record_proposals(engine.drafter)
    result = engine.generate(prompt, 8, stop_on_eos=False)
    assert result.tokens == greedy_reference(prompt, 8)
    first = proposals[0]
    assert first.sources is not None and set(first.sources[1:]) == {"ngram"}
    assert first.layout.tree.num_levels - 1 > 8, first.layout.tree.num_levels


# Costs that make the size matter: a step grows ~12 % of t(1) per node, every size measured.
SLOPED = Profile({n: 30.0 + 3.5 * (n - 1) for n in range(1, 65)}, {w: 30.0 for w in range(1, 65)})


def proposed_trees(proposals) -> list[tuple]:
    return [(tuple(p.layout.tree.parents), tuple(p.tokens.tolist())) for p in proposals]


def test_ngram_mode_proposes_what_the_ngram_drafter_proposes():
    """`--drafter auto` where no model tree pays ("ngram") is `--drafter ngram`: the same trees
    step for step, within the n-gram drafter's own limits (not the hybrid's wider budget, which
    allows trees `--drafter ngram` never proposes), and the same
    prediction of tokens kept per step, so --json reports predicted against observed."""
    from redwood.decode.ngram_drafter import NgramDrafter

    generator = torch.Generator().manual_seed(3)
    span = torch.randint(2, 96, (40,), generator=generator)
    edited = span.clone()
    edited[[7, 19, 31]] = torch.randint(2, 96, (3,), generator=generator)
    prompt = torch.cat([span, torch.tensor([1]), edited, torch.tensor([1]), span[:3]])

    ngram_engine = Engine(target_model(), None, ngram_budget_tree(depth=COPY_DEPTH),
                          drafter=NgramDrafter(target_ms=SLOPED.target_ms, max_length=COPY_DEPTH),
                          profile=SLOPED, live_costs=False)
    ngram_proposals = record_proposals(ngram_engine.drafter)
    by_ngram = ngram_engine.generate(prompt, 48, stop_on_eos=False)

    hybrid_engine = Engine(target_model(), target_model(), MODEL_TREE, profile=SLOPED,
                           live_costs=False)
    hybrid_engine.drafter, hybrid_engine.tree = hybrid_drafting(
        hybrid_engine, lambda t: (MODEL_TREE, 3.0, "ngram"), SLOPED)
    hybrid_proposals = record_proposals(hybrid_engine.drafter)
    by_hybrid = hybrid_engine.generate(prompt, 48, stop_on_eos=False)

    assert by_hybrid.tokens == by_ngram.tokens == greedy_reference(prompt, 48)
    assert len({len(p.layout.tree) for p in ngram_proposals}) > 1     # sizes were chosen
    assert proposed_trees(hybrid_proposals) == proposed_trees(ngram_proposals)
    assert [p.expected_tokens for p in hybrid_proposals] == \
        [p.expected_tokens for p in ngram_proposals]
    assert by_hybrid.stats.predicted_tokens == by_ngram.stats.predicted_tokens > 0


def test_model_steps_report_their_prediction():
    """A step the draft model ran reports the tokens it was predicted to keep (the model's live
    rate over the step's cost, grafts included), so `predicted_vs_observed` covers it."""
    engine = same_model_engine(FLAT)
    proposals = record_proposals(engine.drafter)
    result = engine.generate(torch.tensor([5, 6, 7, 8, 9]), 20, stop_on_eos=False)
    model_steps = [p for p in proposals if "model" in (p.sources or [])]
    assert model_steps and all(p.expected_tokens is not None and p.expected_tokens >= 1.0
                               for p in model_steps)
    assert result.stats.predicted_tokens > 0
