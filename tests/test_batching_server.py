"""The batched server end to end: uvicorn on 127.0.0.1 in a thread, the official `openai`
client, a BatchScheduler over tiny GGUF models (the tokenizer read from the same GGUF); and
what the server's batch is planned with: live acceptance, the plain fallback, the profile.

Every wait is bounded (a deadline, then a failure message); nothing asserts a duration.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import openai
import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp")

from redwood.backends.llamacpp_multi import MultiSeqContext  # noqa: E402
from redwood.decode.params import SamplingParams  # noqa: E402
from redwood.plan.batch_planner import BatchPlanner, LiveAcceptance  # noqa: E402
from redwood.plan.formats import Profile  # noqa: E402
from redwood.errors import RedwoodError  # noqa: E402
from redwood.serve.app import ServerConfig, create_app  # noqa: E402
from redwood.serve.batch_requests import BatchRequest  # noqa: E402
from redwood.serve.batching import BatchScheduler  # noqa: E402
from test_batching import (CLEAR_PROMPTS, P, assert_all_free, context, engine,  # noqa: E402,F401
                           paths, synthetic_profile, trusting)
from test_server import DEADLINE_S, metric, running, scrape  # noqa: E402
from tiny_gguf import tiny_gguf_pair  # noqa: E402,F401

CLIENTS = 50
LANES = 8


@pytest.fixture(scope="module")
def tokenizer(paths):
    from redwood.models.hf_loading import load_tokenizer

    return load_tokenizer(paths[0])


def make_scheduler(paths, lanes=LANES, max_batch=None) -> BatchScheduler:
    contexts = [MultiSeqContext.load(p, lanes, 8, lanes * 512, 256, n_threads=1) for p in paths]
    planner = trusting(synthetic_profile(0.05), 12, 6, 8, 256)
    return BatchScheduler(*contexts, planner, acceptance=lambda params: P, max_batch=max_batch)


class RecordingTransport(httpx.BaseTransport):
    """Keeps every response body as it streams by, to check the raw SSE framing."""

    def __init__(self):
        self.inner = httpx.HTTPTransport()
        self.bodies: list[bytearray] = []
        self.lock = threading.Lock()

    def handle_request(self, request):
        response = self.inner.handle_request(request)
        body = bytearray()
        with self.lock:
            self.bodies.append(body)
        inner = response.stream

        class Stream(httpx.SyncByteStream):
            def __iter__(self):
                for chunk in inner:
                    body.extend(chunk)
                    yield chunk

            def close(self):
                inner.close()

        return httpx.Response(response.status_code, headers=response.headers, stream=Stream(),
                              extensions=response.extensions)


def wait_until(condition, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_fifty_concurrent_streams(paths, engine, tokenizer):
    """50 clients at once (8 live, the rest queued): none lost, every stream ends in [DONE],
    greedy texts equal the single-request engine's, the metrics show the batch, and every KV
    cell is free afterwards."""
    scheduler = make_scheduler(paths)
    app = create_app(scheduler, tokenizer, ServerConfig(model_name="tiny", max_queue=64))
    transport = RecordingTransport()
    with running(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120,
                               http_client=httpx.Client(transport=transport, timeout=120))

        def one(i: int):
            sampled = i % 2 == 1
            chunks = list(client.completions.create(
                model="tiny", prompt=CLEAR_PROMPTS[i % 8], max_tokens=12 + i % 5,
                temperature=0.9 if sampled else 0.0, seed=i, stream=True,
                stream_options={"include_usage": True}))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            return text, finish, chunks[-1].usage

        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(one, range(CLIENTS), timeout=DEADLINE_S * 2))
        wait_until(lambda: scheduler.idle, "the batch to drain")
        samples = scrape(url)
    assert len(results) == CLIENTS and len(transport.bodies) == CLIENTS
    assert all(bytes(body).endswith(b"data: [DONE]\n\n") for body in transport.bodies)
    for i, (text, finish, usage) in enumerate(results):
        assert finish in ("length", "stop") and usage.completion_tokens >= 1
        if i % 2 == 0 and finish == "length":       # greedy: the engine alone, same tokens
            alone = engine.generate(__import__("torch").tensor(CLEAR_PROMPTS[i % 8]), 12 + i % 5)
            assert text == tokenizer.decode(alone.tokens, skip_special_tokens=True), i
    assert metric(samples, "redwood_requests_total", endpoint="/v1/completions",
                  status="200") == CLIENTS
    forwards = metric(samples, "redwood_batch_tokens_per_target_forward_count")
    generated = metric(samples, "redwood_generated_tokens_total")
    assert forwards > 0 and generated > forwards             # several tokens per forward
    assert metric(samples, "redwood_batch_target_forward_tokens_sum") > forwards
    assert metric(samples, "redwood_batch_tree_nodes_count") > forwards    # several per step
    assert metric(samples, "redwood_batch_live_requests") == 0
    for kind in ("speculative", "plain"):                    # a trusting planner: stays 1
        assert metric(samples, "redwood_batch_step_time_ratio", kind=kind) == 1.0
    assert_all_free(scheduler.target, scheduler.draft)


def test_queue_bound_and_disconnect(paths, tokenizer):
    """One live request and a queue of 2: the rest get 429 at once; a streaming client that
    hangs up mid-answer frees its lanes while the others complete."""
    scheduler = make_scheduler(paths, lanes=2, max_batch=1)
    app = create_app(scheduler, tokenizer, ServerConfig(model_name="tiny", max_queue=2))
    with running(app) as url:
        body = {"model": "tiny", "prompt": CLEAR_PROMPTS[0], "max_tokens": 300,
                "temperature": 0, "stream": True}
        with httpx.Client(timeout=DEADLINE_S) as http:
            with http.stream("POST", url + "/v1/completions", json=body) as leaving:
                assert leaving.status_code == 200
                next(leaving.iter_lines())                # generating: now hang up
            wait_until(lambda: not scheduler.live, "the disconnected request to be dropped")
            assert_all_free(scheduler.target, scheduler.draft)

            def post(i):
                return http.post(url + "/v1/completions", json={
                    "model": "tiny", "prompt": CLEAR_PROMPTS[i % 8], "max_tokens": 300,
                    "temperature": 0})

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                statuses = [r.status_code for r in pool.map(post, range(8))]
        wait_until(lambda: scheduler.idle, "the batch to drain")
        samples = scrape(url)
    assert statuses.count(200) >= 3 and statuses.count(429) >= 1
    assert set(statuses) <= {200, 429}
    assert metric(samples, "redwood_requests_total", endpoint="/v1/completions",
                  status="499") == 1
    assert_all_free(scheduler.target, scheduler.draft)


def test_load_batch_scheduler_for_the_cli(paths, tmp_path, monkeypatch):
    """What `redwood serve --max-batch` builds: the profile is measured once and cached, the
    batch size comes from it when not given, --method autoregressive loads no draft, a tree
    JSON fixes the tree."""
    from redwood.measure import profile as profile_module
    from redwood.plan.batch_planner import FixedPlanner
    from redwood.plan.tree import Tree
    from redwood.serve.batch_setup import (PROFILE_METHOD, batch_sizes, choose_max_batch,
                                           load_batch_scheduler)

    options = dict(target=paths[0], draft=paths[1], progress=False, n_threads=1,
                   cache_dir=tmp_path)
    made = []
    try:
        scheduler, tok = load_batch_scheduler(max_batch=2, **options)
        made.append(scheduler)
        assert isinstance(scheduler.planner, BatchPlanner) and scheduler.max_batch == 2
        assert sorted(scheduler.planner.profile.target_ms) == batch_sizes(32)
        assert scheduler.planner.profile.extra["machine_key"]["method"] == PROFILE_METHOD
        assert len(tok) == scheduler.target.vocab_size
        scheduler, _ = load_batch_scheduler(max_batch=2, drafter="ngram", ngram_memory=500,
                                            **options)
        made.append(scheduler)
        assert scheduler.draft is None and scheduler.ngram.memory.max_tokens == 500
        assert 1 in scheduler.ngram.profile.target_ms_by_context[128]    # the engine's profile
        assert scheduler.max_nodes == scheduler.ngram.max_nodes > 1      # reserved per request
        request = scheduler.submit(BatchRequest([5, 6, 7], SamplingParams(8), stop_on_eos=False))
        scheduler.run(100)
        assert request.finish_reason == "length" and len(request.tokens) == 8
        with pytest.raises(RedwoodError, match="draft model or by prompt lookup"):
            load_batch_scheduler(max_batch=2, drafter="hybrid", **options)
        monkeypatch.setattr(profile_module, "profile_latency",
                            lambda *a, **k: pytest.fail("the cached profile was not reused"))
        scheduler, _ = load_batch_scheduler(max_batch=2, **options)
        made.append(scheduler)
        scheduler, _ = load_batch_scheduler(max_batch=3, method="autoregressive", **options)
        made.append(scheduler)
        assert scheduler.draft is None and scheduler.max_batch == 3
        Tree([-1, 0, 0, 1]).save(tmp_path / "tree.json")
        scheduler, _ = load_batch_scheduler(max_batch=2, tree=str(tmp_path / "tree.json"),
                                            **options)
        made.append(scheduler)
        assert isinstance(scheduler.planner, FixedPlanner) and len(scheduler.planner.tree) == 4
    finally:
        for scheduler in made:
            for ctx in (scheduler.target, scheduler.draft):
                if ctx is not None:
                    ctx.close()
    flat = synthetic_profile(0.001, 10.0)                   # batching is nearly free: the cap
    steep = synthetic_profile(10.0, 0.1)                    # cost per token: no gain beyond 2
    assert choose_max_batch(flat, 16) == 16 and choose_max_batch(steep, 16) == 2


def test_serve_refuses_a_bad_max_batch(capsys):
    from redwood.cli.main import main

    assert main(["serve", "--max-batch", "0"]) == 2
    assert "--max-batch must be at least 1" in capsys.readouterr().err
    assert main(["serve", "--max-batch", "4", "--drafter", "hybrid"]) == 2
    assert "use --max-batch 1 with --drafter hybrid" in capsys.readouterr().err


# -- what the batch is planned with ------------------------------------------------------------

# This CPU's shape (shipped 1.5B target / 0.5B draft, min over rounds): t(k) far from flat.
CPU_LIKE = Profile({1: 28, 2: 50, 3: 65, 4: 78, 6: 120, 8: 175, 16: 260, 32: 465},
                   {1: 17, 2: 40, 3: 50, 4: 54, 8: 73, 16: 95, 32: 177})


def run_live(planner, steps: int, accepted) -> list[int]:
    """Plan one request `steps` times, its tree verified as `accepted(tree)` (a path)."""
    live, sizes = LiveAcceptance(P), []
    for _ in range(steps):
        tree = planner.plan([live.for_plan()]).trees[0]
        sizes.append(len(tree))
        live.planned(len(tree) > 1)
        if len(tree) > 1:
            live.record(tree, accepted(tree))
    return sizes


def test_failing_drafts_converge_to_plain_with_probes():
    """Where trees pay at the prior P, a request whose drafts all fail is planned the root alone
    within 6 steps, probes (the prior's tree) after 8 plain steps, drops back at once, and
    probes after 16, 32, then every 64 plain steps; one whose first-ranked drafts are always
    kept keeps its trees and learns p_1 up."""
    planner = BatchPlanner(synthetic_profile(0.5, 10.0), 16, 8, 4, 40)
    sizes = run_live(planner, 260, lambda tree: [0])
    first_plain = sizes.index(1)
    assert sizes[0] > 1 and first_plain <= 6
    rest = sizes[first_plain:]
    probes = [i for i, n in enumerate(rest) if n > 1]
    assert probes[0] == 8 and [b - a for a, b in zip(probes, probes[1:])] == [17, 33, 65, 65, 65]

    def first_ranks(tree):
        path = [0]
        while tree.children[path[-1]]:
            path.append(tree.children[path[-1]][0])
        return path

    assert min(run_live(planner, 20, first_ranks)) > 1
    live = LiveAcceptance(P)
    tree = planner.plan([P]).trees[0]
    for _ in range(10):
        live.record(tree, first_ranks(tree))
    assert live.p[0] > P[0] + 0.1 and live.p[1] < P[1]
    assert LiveAcceptance((0.0,)).for_plan() == (0.0,)        # autoregressive: never a probe


def test_plan_is_plain_when_speculation_does_not_pay():
    """On this CPU's t(N) no batch speculates (its planned rate equals plain batching's), and
    a lagging draft's catch-up tokens count in the first draft level."""
    planner = BatchPlanner(CPU_LIKE, 16, 8, 16, 512)
    for batch in (1, 2, 4, 8):
        plan = planner.plan([(0.9, 0.05)] * batch)
        assert [len(t) for t in plan.trees] == [1] * batch
        assert plan.tokens_per_second == pytest.approx(1000 * batch / CPU_LIKE.target_ms[batch])
    cheap = Profile({n: 10.0 + 0.5 * n for n in range(1, 41)},
                    {n: 1.0 + 2.0 * n for n in range(1, 41)})
    planner = BatchPlanner(cheap, 16, 8, 4, 40)
    assert len(planner.plan([P], [0]).trees[0]) > 1
    assert len(planner.plan([P], [16]).trees[0]) == 1         # 17 draft tokens first: no gain


def test_batch_profile_takes_the_minimum_of_warm_rounds(paths, monkeypatch):
    """measure_batch_profile times every size after a warm-up round and keeps the minimum, so a
    slow first run or bursts of other work (every third reading here) do not enter t(N)."""
    from redwood.measure import profile as profile_module
    from redwood.serve.batch_setup import ROUNDS_SMALL, measure_batch_profile

    calls = []

    class NoisyTimer:
        def __init__(self, device):
            pass

        def __call__(self, fn):
            fn()
            calls.append(1)
            return 0.5 if len(calls) % 3 == 1 else 0.010          # s; the first is slow too

    monkeypatch.setattr(profile_module, "_Timer", NoisyTimer)
    made = [context(path, lanes=5) for path in paths]               # 40 sequence ids
    try:
        sizes = [1, 2, 3, 4, 36]
        profile = measure_batch_profile(made[0].backend, made[1].backend, sizes)
    finally:
        for ctx in made:
            ctx.close()
    assert sorted(profile.target_ms) == sorted(profile.draft_ms) == sizes
    assert set(profile.target_ms.values()) == set(profile.draft_ms.values()) == {10.0}
    samples = profile.extra["samples_ms"]["target"]
    assert len(samples["1"]) == ROUNDS_SMALL and len(samples["36"]) < ROUNDS_SMALL
    assert profile.extra["source"]["statistic"] == "min"


def test_logit_rows_are_a_slice_when_contiguous():
    """A job's logits rows in batch order come back as a view (no per-step index copy)."""
    import numpy as np

    from redwood.backends.llamacpp_jobs import take_rows as _take_rows

    x = torch.arange(12.0).reshape(4, 3)
    rows = _take_rows(x, np.array([1, 2]))
    assert rows.data_ptr() == x[1].data_ptr() and torch.equal(rows, x[1:3])
    assert torch.equal(_take_rows(x, np.array([3, 0])), x[[3, 0]])


def test_a_request_whose_drafts_fail_runs_plain(paths, tiny_gguf_pair, engine):
    """An unrelated draft (another seed) is almost never accepted: after a few trees the
    request decodes plainly, with rare probes, and its output is the engine's alone."""
    made = [context(paths[0]), context(tiny_gguf_pair[1])]
    try:
        planner = trusting(synthetic_profile(0.5, 10.0), 12, 6, 8, 128)
        sched = BatchScheduler(*made, planner, acceptance=lambda params: P)
        request = sched.submit(BatchRequest(CLEAR_PROMPTS[0], SamplingParams(40),
                                            stop_on_eos=False))
        sched.run(1000)
        assert request.tree_sizes[0] == 1                   # the first token: from the prefill
        sizes = request.tree_sizes[1:]
        rest = sizes[sizes.index(1):]                       # after the first plain step
        assert sizes[0] > 1 and sizes.index(1) <= 6
        assert sum(n > 1 for n in rest) <= 1 + len(rest) // 8      # probes only
        assert request.tokens == engine.generate(torch.tensor(CLEAR_PROMPTS[0]), 40,
                                                 stop_on_eos=False).tokens
        assert_all_free(*made)
    finally:
        for ctx in made:
            ctx.close()


def test_scheduler_turns_plain_when_speculative_steps_cost_more(paths, engine, monkeypatch):
    """A profile that wildly underestimates speculation: every draft decode here costs 20x its
    profile time (injected: a fake clock advances by each decode's cost; a target decode costs
    the profile's t(N)). The first steps speculate; after a few timed speculative steps every
    request runs plain and stays plain (probes included); steps carrying prompt chunks are
    never timed; greedy outputs equal each request run alone."""
    from redwood.backends.llamacpp_multi import Append

    profile = synthetic_profile(0.5, 10.0)
    made = [context(path) for path in paths]
    now = [0.0]

    def costing(ctx, ms):
        for name in ("decode", "decode_rows"):          # decode_rows: the plain steps
            monkeypatch.setattr(ctx, name, charged(getattr(ctx, name), ms))

    def charged(decode, ms):
        def timed(jobs, **options):
            out = decode(jobs, **options)
            now[0] += ms(sum(len(j.ids) if isinstance(j, Append) else len(j.nodes)
                             for j in jobs)) / 1000.0
            return out
        return timed

    try:
        costing(made[0], lambda n: profile.target_ms[n])
        costing(made[1], lambda n: 20 * profile.draft_level_ms(n))
        planner = BatchPlanner(profile, 12, 6, 8, 128)
        sched = BatchScheduler(*made, planner, acceptance=lambda params: P, prefill_chunk=4,
                               clock=lambda: now[0])
        prompts = [CLEAR_PROMPTS[0], CLEAR_PROMPTS[1], CLEAR_PROMPTS[4]]
        lengths = [120, 120, 40]
        requests = [sched.submit(BatchRequest(p, SamplingParams(n), stop_on_eos=False))
                    for p, n in zip(prompts[:2], lengths)]
        steps = []
        while sched.step():
            steps.append(sched.last)
            if len(steps) == 12:              # joins late: its prompt chunks share live steps
                requests.append(sched.submit(BatchRequest(prompts[2], SamplingParams(lengths[2]),
                                                          stop_on_eos=False)))
        for info in steps:
            assert info.timed == (info.decoding > 0 and info.prompt_tokens == 0
                                  and info.catch_up == 0)
        assert any(info.decoding and info.prompt_tokens for info in steps[12:])
        speculative = [i for i, info in enumerate(steps) if max(info.tree_sizes, default=1) > 1]
        assert speculative and speculative[0] <= 2 and len(speculative) <= 8
        assert len(steps) - speculative[-1] > 60     # then plain for good, probes answered plain
        assert sum(planner.costs.steps.values()) == sum(info.timed for info in steps)
        assert planner.costs.ratios["speculative"] > 1.3
        assert planner.costs.ratios["plain"] == pytest.approx(1.0)
        for request, prompt, n in zip(requests, prompts, lengths):
            assert request.tokens[:40] == engine.generate(torch.tensor(prompt), 40,
                                                          stop_on_eos=False).tokens
            assert len(request.tokens) == n
        assert_all_free(*made)
    finally:
        for ctx in made:
            ctx.close()


def test_prefix_cache_through_the_batched_server(paths, engine, tokenizer):
    """A follow-up turn reports its reused prompt tokens in usage (streamed usage too), a
    request with "cache_prompt": false reuses none and answers the same, and a burst of
    requests sharing a long prefix evaluates it once: /metrics counts the hits and the reused
    tokens (the prefix, once per follower)."""
    scheduler = make_scheduler(paths, lanes=4)
    app = create_app(scheduler, tokenizer, ServerConfig(model_name="tiny", max_queue=16))
    system = (CLEAR_PROMPTS[4] + CLEAR_PROMPTS[6] + CLEAR_PROMPTS[1]) * 3        # 66 tokens
    with running(app) as url, httpx.Client(timeout=DEADLINE_S) as http:
        def complete(prompt, **extra):
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 10, "temperature": 0}
            response = http.post(url + "/v1/completions", json={**body, **extra})
            assert response.status_code == 200, response.text
            return response.json()

        first = complete(CLEAR_PROMPTS[0])
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        turn2 = CLEAR_PROMPTS[0] + tokenizer.encode(first["choices"][0]["text"]) + CLEAR_PROMPTS[2]
        second = complete(turn2)
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(CLEAR_PROMPTS[0])
        fresh = complete(turn2, cache_prompt=False)
        assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert fresh["choices"][0]["text"] == second["choices"][0]["text"]
        before = scrape(url)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            burst = list(pool.map(lambda i: complete(system + CLEAR_PROMPTS[i]), range(4)))
        wait_until(lambda: scheduler.idle, "the batch to drain")
        after = scrape(url)
    for i, answer in enumerate(burst):
        alone = engine.generate(torch.tensor(system + CLEAR_PROMPTS[i]), 10).tokens
        assert answer["choices"][0]["text"] == tokenizer.decode(alone, skip_special_tokens=True)
    reused = [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in burst]
    assert sorted(reused)[1:] == [len(system)] * 3          # everyone but the first shares it
    gained = (metric(after, "redwood_prompt_cached_tokens_total")
              - metric(before, "redwood_prompt_cached_tokens_total"))
    assert gained == sum(reused)
    assert metric(after, "redwood_prefix_cache_lookups_total", result="hit") >= 1
    assert metric(after, "redwood_prefix_cache_cells") > 0
    assert_all_free(scheduler.target, scheduler.draft)
