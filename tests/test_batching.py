"""Continuous batching on llama.cpp (tiny random GGUF models): the multi-sequence context, the
scheduler (batched output = each request alone, exactness under sharing, join/leave/cancel, KV
bounds) and the batch planner.

The pair is test_engine_llamacpp's: the session's seed-0 tiny model as target, the same model
with 10% weight noise as draft (agrees often, not always).

Near-ties. llama.cpp's kernels depend on the batch size, so one request's logits differ a
little (max |diff| about 4e-3 on these models) depending on what shares its decode. Greedy
equality is therefore asserted on prompts whose 40 greedy tokens all have a target top-2 margin
of at least 0.15 (checked here as a precondition). With the same seed, sampled outputs usually
equal the request run alone (the per-request draws are the engine's, in the same order), but an
acceptance test u * q < p sitting within ~1e-3 of its threshold can flip: measured 1 request in
5 diverged somewhere in 30 tokens; exactness is tested by chi-square instead.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp")

from redwood.backends.llamacpp import LlamaCppBackend  # noqa: E402
from redwood.backends.llamacpp_multi import Append, MultiSeqContext, TreeNodes  # noqa: E402
from redwood.decode.engine import Engine  # noqa: E402
from redwood.decode.params import SamplingParams  # noqa: E402
from redwood.decode.sampling import process_logits  # noqa: E402
from redwood.errors import RedwoodError  # noqa: E402
from redwood.plan.batch_planner import BatchPlanner, FixedPlanner  # noqa: E402
from redwood.plan.formats import Profile  # noqa: E402
from redwood.plan.step_costs import StepCosts  # noqa: E402
from redwood.plan.tree import Tree, star  # noqa: E402
from redwood.serve.batch_requests import BatchRequest  # noqa: E402
from redwood.serve.batching import BatchScheduler  # noqa: E402
from test_verify import assert_law  # noqa: E402
from tiny_gguf import tiny_gguf_pair, write_perturbed_gguf  # noqa: E402,F401

TOL = 0.03                 # |logit| tolerance across kernels (test_llamacpp_backend.py)
LANES, LEAVES, N_CTX, N_BATCH = 4, 8, 2048, 128
TREE = Tree([-1, 0, 0, 0, 1, 1, 2, 4, 4, 7])         # 10 nodes, 5 leaves, 5 levels
# Prompts whose 40 greedy target tokens all have a top-2 margin >= 0.15 (scanned once).
CLEAR_PROMPTS = [[265, 239, 89], [207, 28, 179, 9, 176, 178], [196, 120], [102, 130, 12, 16],
                 [203, 30, 171, 173, 62, 251, 220, 54, 145], [247, 68, 33],
                 [172, 237, 118, 185, 228, 157, 120], [213, 41, 250, 110, 86, 182]]
P = (0.7, 0.1, 0.05)      # the acceptance vector the planner is told


def synthetic_profile(per_token: float = 0.2, base: float = 2.0, draft: float = 0.1) -> Profile:
    """t(N) = base + per_token * N ms for the target, `draft` times that for the draft."""
    sizes = list(range(1, 129))
    return Profile({n: base + per_token * n for n in sizes},
                   {n: draft * (base + per_token * n) for n in sizes})


def trusting(profile: Profile, *args) -> BatchPlanner:
    """No live step-time correction: what the profile chooses must not depend on this CPU."""
    return BatchPlanner(profile, *args, costs=StepCosts(decay=1.0))


def context(path, lanes=LANES, n_ctx=N_CTX) -> MultiSeqContext:
    return MultiSeqContext.load(path, lanes, LEAVES, n_ctx, N_BATCH, n_threads=1)


@pytest.fixture(scope="module")
def paths(tiny_gguf_pair, tmp_path_factory):
    directory = tmp_path_factory.mktemp("batching")
    return tiny_gguf_pair[0], write_perturbed_gguf(directory / "tiny-seed0-noisy.gguf", 0, 0.1)


@pytest.fixture(scope="module")
def contexts(paths):
    made = [context(path) for path in paths]
    yield made
    for ctx in made:
        ctx.close()


@pytest.fixture(scope="module")
def engine(paths):
    """The single-request engine on plain llama.cpp backends: the reference."""
    backends = [LlamaCppBackend(p, n_ctx=512, n_seq_max=16, n_batch=64, n_threads=1)
                for p in paths]
    yield Engine(*backends, TREE)
    for backend in backends:
        backend.close()


def scheduler(contexts, planner=None, **options) -> BatchScheduler:
    return BatchScheduler(*contexts, planner or FixedPlanner(TREE, N_BATCH),
                          acceptance=lambda params: P, **options)


def assert_all_free(*contexts):
    """No lane is held, and llama.cpp holds exactly the idle lanes' cached prefixes: each on
    its lane's first id at positions 0..length-1, nothing on any other id."""
    for ctx in contexts:
        assert not any(lane.busy for lane in ctx.lanes)
        assert ctx.used_cells() == ctx.idle_cells()
        for lane in ctx.lanes:
            assert len(lane.tokens) == lane.length
            assert ctx.seq_pos_max(lane.base) == lane.length - 1
            assert (lane.index in ctx.index) == (lane.length > 0)
            held = [s for s in range(lane.base + 1, lane.base + lane.width)
                    if ctx.seq_pos_max(s) != -1]
            assert not held, f"tree sequence ids still holding cells: {held}"


# -- 1. the multi-sequence context ----------------------------------------------------------

def test_shared_decode_equals_each_request_alone(contexts, engine):
    """Three lanes' trees in one decode: each equals its own single-backend tree run; keep_path
    compacts one lane without touching the others; release frees its ids."""
    ctx, single = contexts[0], engine.target_backend
    prompts = CLEAR_PROMPTS[:3]
    lanes = [ctx.acquire() for _ in prompts]
    try:
        firsts = ctx.decode([Append(lane, p, rows=1) for lane, p in zip(lanes, prompts)])
        tokens = [torch.randint(0, 266, (len(TREE),), generator=torch.Generator().manual_seed(i))
                  for i in range(3)]
        outs = ctx.decode([TreeNodes(lane, TREE, range(len(TREE)), tk, lane.length)
                           for lane, tk in zip(lanes, tokens)])
        for p, first, tk, out in zip(prompts, firsts, tokens, outs):
            single.reset()
            assert (single.append(p, rows=1) - first).abs().max() <= TOL
            expected = single.run_tree(TREE, range(len(TREE)), tk, single.cache_length())
            assert (out - expected).abs().max() <= TOL
        ctx.keep_path(lanes[0], [0, 1, 4, 7, 9])
        assert lanes[0].length == len(prompts[0]) + 5 and lanes[1].step is not None
        assert ctx.seq_pos_max(lanes[0].base) == lanes[0].length - 1
        assert all(ctx.seq_pos_max(lanes[0].base + k) == -1 for k in range(1, LEAVES))
        ctx.keep_path(lanes[1], [0, 3])
        ctx.drop_tentative(lanes[2])
        assert ctx.seq_pos_max(lanes[2].base) == len(prompts[2]) - 1
        after = ctx.decode([Append(lanes[0], [5], rows=1)])[0]        # the compacted text
        single.reset()
        text = prompts[0] + [int(tokens[0][u]) for u in (0, 1, 4, 7, 9)] + [5]
        assert (after - single.append(text)).abs().max() <= TOL
    finally:
        for lane in lanes:
            ctx.release(lane)
    assert_all_free(ctx)


def test_refused_before_any_native_call(contexts, monkeypatch):
    ctx = contexts[0]
    calls = []
    monkeypatch.setattr(ctx.backend, "_decode", lambda what: calls.append(what))
    a, b = ctx.acquire(), ctx.acquire()
    try:
        cases = [([TreeNodes(a, star(LEAVES + 1), range(LEAVES + 2), [1] * (LEAVES + 2), 0)],
                  "leaves"),
                 ([Append(a, [1] * 100), Append(b, [1] * 100)], "n_batch"),
                 ([Append(a, [1]), TreeNodes(a, TREE, [0], [1], 0)], "one job per lane"),
                 ([Append(a, [600])], "out of range")]
        for jobs, match in cases:
            with pytest.raises(RedwoodError, match=match):
                ctx.decode(jobs)
        ctx.release(b)
        with pytest.raises(RedwoodError, match="not held"):
            ctx.decode([Append(b, [1])])
        a.length = ctx.n_ctx - 5                  # bookkeeping only: the cache looks full
        with pytest.raises(RedwoodError, match="KV cache full"):
            ctx.decode([Append(a, [1] * 10)])
        a.length = 0
    finally:
        ctx.release(a)
    assert calls == [] and a.length == 0
    assert_all_free(ctx)


def test_one_token_per_lane_takes_the_short_path_with_the_same_rows_and_checks(contexts):
    """A plain batched step (one token and its row per lane, Python ints) fills the batch
    through ctypes: its rows equal the general path's (numpy ids take that one), it commits
    the same bookkeeping, and it refuses the same bad input before any native call."""
    ctx = contexts[0]
    prompts = CLEAR_PROMPTS[:2]
    lanes = [ctx.acquire() for _ in range(4)]
    try:
        ctx.decode([Append(lane, prompts[i % 2]) for i, lane in enumerate(lanes)])
        ctx._prepare = None                                   # the general path's first step
        try:
            short = ctx.decode([Append(lanes[0], [7], rows=1), Append(lanes[1], [9], rows=1)])
        finally:
            del ctx._prepare
        general = ctx.decode([Append(lanes[2], [np.int64(7)], rows=1),
                              Append(lanes[3], np.array([9]), rows=1)])
        for a, b in zip(short, general):
            assert a.shape == b.shape == (1, ctx.vocab_size)
            assert (a - b).abs().max() <= TOL
        assert [lane.length for lane in lanes] == [len(prompts[0]) + 1, len(prompts[1]) + 1] * 2
        assert lanes[0].tokens == lanes[2].tokens and lanes[0].tokens[-1] == 7
        views = ctx.decode([Append(lanes[0], [3], rows=1)], copy=False)
        copies = ctx.decode([Append(lanes[2], [3], rows=1)])
        assert (views[0] - copies[0]).abs().max() <= TOL      # read before the next decode
        # decode_rows: the same rows as numpy views, for 2 lanes and then 1 (views rebuilt);
        # lanes 0 and 2 hold the same tokens, as do 1 and 3
        for token, pairs in ((5, [(0, 2), (1, 3)]), (6, [(0, 2)])):
            rows = ctx.decode_rows([Append(lanes[a], [token], rows=1) for a, _ in pairs])
            rows = [np.array(r) for r in rows]                # read before the next decode
            again = ctx.decode([Append(lanes[b], [token], rows=1) for _, b in pairs])
            assert [r.shape for r in rows] == [(ctx.vocab_size,)] * len(pairs)
            for r, a in zip(rows, again):
                assert np.abs(r - a[0].numpy()).max() <= TOL
        for bad in ([Append(lanes[0], [1, 2], rows=1)], [Append(lanes[0], [np.int64(1)], rows=1)],
                    [TreeNodes(lanes[0], Tree([-1, 0]), [0, 1], torch.tensor([1, 2]), 0)], []):
            with pytest.raises(RedwoodError, match="one Python-int token"):
                ctx.decode_rows(bad)
    finally:
        for lane in lanes:
            ctx.release(lane)
    a, b = ctx.acquire(), ctx.acquire()
    calls = []
    real = ctx.backend._decode
    ctx.backend._decode = lambda what: calls.append(what)
    try:
        with pytest.raises(RedwoodError, match="out of range"):
            ctx.decode([Append(a, [1], rows=1), Append(b, [600], rows=1)])
        ctx.release(b)
        with pytest.raises(RedwoodError, match="not held"):
            ctx.decode([Append(a, [1], rows=1), Append(b, [1], rows=1)])
        a.length = ctx.n_ctx
        with pytest.raises(RedwoodError, match="KV cache full"):
            ctx.decode([Append(a, [1], rows=1)])
        a.length = 0
    finally:
        ctx.backend._decode = real
        ctx.release(a)
    assert calls == [] and a.length == 0 and a.tokens == []
    assert_all_free(ctx)


# -- 2. batched output equals each request alone ----------------------------------------------

@pytest.mark.parametrize("planner", ["fixed", "batch"])
def test_batched_greedy_equals_engine_alone(contexts, engine, planner):
    """8 requests through 4 lanes (later ones join as earlier ones leave): each output equals the
    single-request engine's, token for token, and every cell is free afterwards."""
    plan = FixedPlanner(TREE, N_BATCH) if planner == "fixed" else trusting(
        synthetic_profile(), 12, 6, LEAVES, N_BATCH)
    sched = scheduler(contexts, plan)
    lengths = [40, 25, 40, 33, 40, 12, 40, 29]
    requests = [sched.submit(BatchRequest(p, SamplingParams(n), stop_on_eos=False))
                for p, n in zip(CLEAR_PROMPTS, lengths)]
    sched.run(2000)
    reference = engine.target_backend
    for request, prompt, n in zip(requests, CLEAR_PROMPTS, lengths):
        alone = engine.generate(torch.tensor(prompt), n, stop_on_eos=False)
        reference.reset()
        logits = reference.append(prompt + alone.tokens, rows=n + 1)[:-1]
        top = logits.topk(2, dim=-1).values
        assert (top[:, 0] - top[:, 1]).min() > 2 * TOL, f"{prompt}: a near-tie, not a fair test"
        assert request.finish_reason == "length"
        assert request.tokens == alone.tokens, f"prompt {prompt}"
        assert sum(request.steps) == n
    trees = {size for r in requests for size in r.tree_sizes}
    assert max(trees) > 1 and sum(sum(r.steps) for r in requests) > 1.5 * sum(
        len(r.steps) for r in requests)                     # speculation paid
    assert_all_free(*contexts)


def test_batch_planner_shrinks_trees_under_load(contexts):
    """The same requests under a flat and a steep t(N): trees shrink to the root when the
    forward's cost grows with every token, and the output does not change."""
    outputs = {}
    for name, per_token in (("flat", 0.02), ("steep", 5.0)):
        plan = trusting(synthetic_profile(per_token), 12, 6, LEAVES, N_BATCH)
        sched = scheduler(contexts, plan)
        requests = [sched.submit(BatchRequest(p, SamplingParams(20), stop_on_eos=False))
                    for p in CLEAR_PROMPTS[:4]]
        sched.run(1000)
        outputs[name] = [r.tokens for r in requests]
        sizes = [s for r in requests for s in r.tree_sizes]
        assert (max(sizes) > 4) if name == "flat" else (set(sizes) == {1})
    assert outputs["flat"] == outputs["steep"]
    assert_all_free(*contexts)


def test_draft_idle_unless_a_tree_pays(contexts, engine):
    """Under a profile where speculation never pays, the draft never runs (no decode, no
    cells); with a tree for everyone, a long prompt's draft first catches up in chunks
    while its root runs alone, then it speculates."""
    steep = trusting(synthetic_profile(5.0), 12, 6, LEAVES, N_BATCH)
    sched = scheduler(contexts, steep)
    cached = contexts[1].used_cells()             # earlier tests' cached prefixes, at most
    request = sched.submit(BatchRequest(CLEAR_PROMPTS[4], SamplingParams(30), stop_on_eos=False))
    while not request.done:
        sched.step()
        assert sched.last.draft_decodes == 0 and contexts[1].used_cells() <= cached
    sched = scheduler(contexts, prefill_chunk=8)
    long_prompt = CLEAR_PROMPTS[0] * 12                      # 35 tokens: the draft lags
    request = sched.submit(BatchRequest(long_prompt, SamplingParams(40), stop_on_eos=False))
    sched.run(1000)
    sizes = request.tree_sizes
    assert sizes[:2] == [1, 1] and sizes[-1] == len(TREE)    # caught up by chunks, then trees
    assert request.tokens == engine.generate(torch.tensor(long_prompt), 40,
                                             stop_on_eos=False).tokens
    assert_all_free(*contexts)


def test_failed_steps_are_undone_then_the_batch_fails(contexts, engine, monkeypatch):
    """A failing target decode undoes the step (the next one repeats it and the output is
    unchanged); after MAX_FAILED_STEPS in a row the live requests end with "error" and every
    lane is freed, and the scheduler keeps serving."""
    sched = scheduler(contexts)
    target = contexts[0]
    real = target.decode
    failures = {"left": 1}

    def flaky(jobs, **options):
        if failures["left"] and any(isinstance(job, TreeNodes) for job in jobs):
            failures["left"] -= 1
            raise RedwoodError("injected decode failure")
        return real(jobs, **options)

    monkeypatch.setattr(target, "decode", flaky)
    a = sched.submit(BatchRequest(CLEAR_PROMPTS[0], SamplingParams(30), stop_on_eos=False))
    sched.run(1000)
    assert failures["left"] == 0 and a.tokens == engine.generate(
        torch.tensor(CLEAR_PROMPTS[0]), 30, stop_on_eos=False).tokens
    failures["left"] = 10**6
    b = sched.submit(BatchRequest(CLEAR_PROMPTS[1], SamplingParams(30), stop_on_eos=False))
    sched.run(1000)
    assert b.finish_reason == "error" and "injected" in str(b.error)
    assert_all_free(*contexts)
    failures["left"] = 0
    c = sched.submit(BatchRequest(CLEAR_PROMPTS[1], SamplingParams(30), stop_on_eos=False))
    sched.run(1000)
    assert c.finish_reason == "length"


# -- 3. exactness while others share the batch ------------------------------------------------

CHI_PROMPT = [72, 101, 108, 108, 111]
CHI_DRAWS = 1500


def joint_law(backend, temperature, prompt=CHI_PROMPT) -> dict:
    """{(first, second): probability} of the target alone, from fresh prefills."""
    backend.reset()
    first = process_logits(backend.append(prompt)[0], temperature).double()
    law = {}
    for a in torch.nonzero(first > 1e-9).flatten().tolist():
        backend.reset()
        second = process_logits(backend.append(prompt + [a])[0], temperature).double()
        for b in torch.nonzero(second > 0).flatten().tolist():
            law[(a, b)] = float(first[a] * second[b])
    return law


@pytest.mark.parametrize("method, live", [("sequoia", 0), ("specinfer", 0), ("sequoia", 1),  # 7 s
                                          pytest.param("chain", 0, marks=pytest.mark.slow)])
def test_first_two_tokens_follow_the_target_while_sharing(contexts, engine, method, live):
    """Two-token requests (seeds 0..N-1, T = 1) run two at a time beside two longer requests
    (one sampled, one greedy, replaced as they finish); their first two tokens follow the
    target's own law. live: trees planned from every request's live acceptance."""
    sched = scheduler(contexts, trusting(synthetic_profile(0.02), 12, 6, LEAVES, N_BATCH)
                      if live else None)
    background, counts, gained, pending, seed = [], Counter(), 0, [], 0
    for step in range(20 * CHI_DRAWS):
        background = [r for r in background if not r.done]
        while len(background) < 2:
            temperature = 0.8 if len(background) == 0 else 0.0
            background.append(sched.submit(BatchRequest(
                CLEAR_PROMPTS[step % 8], SamplingParams(60, temperature, seed=step),
                stop_on_eos=False)))
        while len(pending) < 2 and seed < CHI_DRAWS:
            pending.append(sched.submit(BatchRequest(CHI_PROMPT, SamplingParams(2, 1.0, seed=seed),
                                                     method=method, stop_on_eos=False)))
            seed += 1
        sched.step()
        for request in [r for r in pending if r.done]:
            pending.remove(request)
            counts[tuple(request.tokens)] += 1
            gained += request.steps[0]
        if seed == CHI_DRAWS and not pending:
            break
    assert sum(counts.values()) == CHI_DRAWS
    assert gained > 1.3 * CHI_DRAWS                       # trees were accepted, not just bonuses
    assert sched.cache_stats.hits > CHI_DRAWS // 2        # most ran on a cached/shared prefix
    assert_law(counts, joint_law(engine.target_backend, 1.0), CHI_DRAWS)
    sched.close()
    assert_all_free(*contexts)


# -- 4. join, leave, cancel, bounds ---------------------------------------------------------

def test_join_leave_and_cancel_mid_generation(contexts, engine):
    sched = scheduler(contexts)
    a = sched.submit(BatchRequest(CLEAR_PROMPTS[0], SamplingParams(40), stop_on_eos=False))
    b = sched.submit(BatchRequest(CLEAR_PROMPTS[1], SamplingParams(40), stop_on_eos=False))
    for _ in range(3):
        sched.step()
    c = sched.submit(BatchRequest(CLEAR_PROMPTS[2], SamplingParams(40), stop_on_eos=False))
    sched.step()
    (b_live,) = [x for x in sched.live if x.request is b]
    assert b.tokens and not b.done
    b.cancel()                                           # mid-generation, others running
    sched.step()
    assert b.finish_reason == "cancelled" and not a.done and not c.done
    for lane, ctx in ((b_live.target_lane, contexts[0]), (b_live.draft_lane, contexts[1])):
        assert not lane.busy               # its committed cells stay cached, its tree's go
        assert ctx.seq_pos_max(lane.base) == lane.length - 1 and lane.index in ctx.index
        assert all(ctx.seq_pos_max(s) == -1 for s in range(lane.base + 1, lane.base + lane.width))
    stopped = [0]
    d = sched.submit(BatchRequest(CLEAR_PROMPTS[3], SamplingParams(40), stop_on_eos=False,
                                  on_tokens=lambda r, new: stopped.__setitem__(0, len(r.tokens))
                                  or len(r.tokens) < 10))
    gone = sched.submit(BatchRequest(CLEAR_PROMPTS[4], SamplingParams(40)))
    gone.cancel()                                        # cancelled while waiting
    sched.run(1000)
    assert gone.finish_reason == "cancelled" and not gone.tokens
    assert d.finish_reason == "stopped" and 10 <= len(d.tokens) == stopped[0]
    for request, prompt in ((a, CLEAR_PROMPTS[0]), (c, CLEAR_PROMPTS[2])):
        assert request.tokens == engine.generate(torch.tensor(prompt), 40,
                                                 stop_on_eos=False).tokens
    assert d.tokens == engine.generate(torch.tensor(CLEAR_PROMPTS[3]), 40,
                                       stop_on_eos=False).tokens[:len(d.tokens)]
    assert_all_free(*contexts)


def test_kv_cells_bound_admission(paths, engine):
    """A request that can never fit is refused at submit; requests that do not fit beside a
    running one wait for its cells (nothing is harmed), then run together, a long prompt being
    prefilled in chunks beside a decoding request."""
    made = [context(path, lanes=2, n_ctx=256) for path in paths]
    try:
        sched = BatchScheduler(*made, FixedPlanner(TREE, N_BATCH), prefill_chunk=16)
        with pytest.raises(RedwoodError, match="exceed the batch cache"):
            sched.submit(BatchRequest([5] * 200, SamplingParams(60)))
        first = sched.submit(BatchRequest(CLEAR_PROMPTS[0], SamplingParams(150), stop_on_eos=False))
        long_prompt = sched.submit(BatchRequest(CLEAR_PROMPTS[1] * 10, SamplingParams(60),
                                                stop_on_eos=False))
        short = sched.submit(BatchRequest(CLEAR_PROMPTS[2], SamplingParams(20), stop_on_eos=False))
        sched.step()
        assert len(sched.live) == 1 and len(sched.waiting) == 2     # no room for the others
        while not first.done:
            sched.step()
        sched.step()                     # admits both: prompt chunks of 16 tokens per step
        sched.step()
        (prefilling,) = [x for x in sched.live if x.request is long_prompt]
        assert short.tokens and not long_prompt.tokens
        assert 0 < prefilling.prefilled < len(prefilling.prefix)
        sched.run(1000)
        assert [len(r.tokens) for r in (first, long_prompt, short)] == [150, 60, 20]
        for request, prompt, n in ((first, CLEAR_PROMPTS[0], 40), (short, CLEAR_PROMPTS[2], 20)):
            assert request.tokens[:n] == engine.generate(torch.tensor(prompt), n,
                                                         stop_on_eos=False).tokens
        assert_all_free(*made)
    finally:
        for ctx in made:
            ctx.close()


# -- 5. the batch planner (pure numpy) ------------------------------------------------------

def test_planner_allocation_rules():
    profile = synthetic_profile(0.5, 10.0)
    planner = BatchPlanner(profile, max_budget=16, max_depth=8, max_leaves=4, max_total=40)
    sizes = {b: [len(t) for t in planner.plan([P] * b).trees] for b in (1, 2, 4, 8, 16)}
    assert sizes[1][0] > 1 and all(sum(s) <= 40 for s in sizes.values())
    means = [np.mean(sizes[b]) for b in (1, 2, 4, 8, 16)]
    assert means == sorted(means, reverse=True)               # trees shrink as the batch grows
    for b, trees in ((b, planner.plan([P] * b).trees) for b in (1, 4)):
        assert all(sum(1 for kids in t.children if not kids) <= 4 for t in trees)
    # Different acceptance: the request the draft predicts better gets the bigger tree.
    good, poor = planner.plan([(0.9, 0.05), (0.3, 0.1)]).trees
    assert len(good) > len(poor)
    # No speculation for an all-zero vector; a steep profile gives plain batched decoding.
    assert [len(t) for t in planner.plan([(0.0,), P]).trees][0] == 1
    steep = BatchPlanner(synthetic_profile(50.0, 1.0), 16, 8, 4, 40)
    assert [len(t) for t in steep.plan([P] * 4).trees] == [1] * 4
    # Unmeasured totals are never chosen.
    sparse = Profile({1: 10.0, 4: 11.0, 8: 40.0}, {1: 1.0, 2: 1.0, 4: 1.0})
    plan = BatchPlanner(sparse, 16, 8, 4, 40).plan([P])
    assert plan.total_tokens in (1, 4, 8)


def test_the_first_token_comes_from_the_prefill_decode(contexts, engine):
    """The chunk that completes a prompt also runs its last token (the root), so the first
    token is sampled from that decode: a 35-token prefix in chunks of 8 yields its first token
    at step 5, not 6, and the output is still the engine's."""
    prompt = CLEAR_PROMPTS[0] * 12                            # 36 tokens: prefix of 35
    sched = scheduler(contexts, prefill_chunk=8)
    request = sched.submit(BatchRequest(prompt, SamplingParams(12), stop_on_eos=False,
                                        cache_prompt=False))
    for step in range(1, 6):
        sched.step()
        assert len(request.tokens) == (1 if step == 5 else 0), step
    sched.run(1000)
    assert request.tokens == engine.generate(torch.tensor(prompt), 12, stop_on_eos=False).tokens


def test_a_lone_prompt_prefills_in_larger_chunks(contexts):
    """With nothing decoding, lone_prefill_chunk bounds the chunk; once a request decodes,
    prefill_chunk does (the live request's step is not delayed)."""
    sched = scheduler(contexts, prefill_chunk=8, lone_prefill_chunk=32)
    long_prompt = CLEAR_PROMPTS[0] * 12                           # a 35-token prefix
    first = sched.submit(BatchRequest(long_prompt, SamplingParams(30), stop_on_eos=False,
                                      cache_prompt=False))
    sched.step()
    assert sched.last.prompt_tokens == 32
    sched.step()
    assert first.tokens                                           # 3 more + its first token
    second = sched.submit(BatchRequest(CLEAR_PROMPTS[1] * 6, SamplingParams(4),
                                       stop_on_eos=False, cache_prompt=False))
    sched.step()
    assert sched.last.prompt_tokens == 8 and not second.tokens
    sched.run(1000)
