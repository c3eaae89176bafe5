"""The batched server end to end: uvicorn on 127.0.0.1 in a thread, the official `openai`
client, a BatchScheduler over tiny GGUF models (the tokenizer read from the same GGUF).

Every wait is bounded (a deadline, then a failure message); nothing asserts a duration.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import openai
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from redwood.backends.llamacpp_multi import MultiSeqContext  # noqa: E402
from redwood.plan.batch_planner import BatchPlanner  # noqa: E402
from redwood.serve.app import ServerConfig, create_app  # noqa: E402
from redwood.serve.batching import BatchScheduler  # noqa: E402
from test_batching import (CLEAR_PROMPTS, P, assert_all_free, engine, paths,  # noqa: E402,F401
                           synthetic_profile)
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
    planner = BatchPlanner(synthetic_profile(0.05), 12, 6, 8, 256)
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
    from redwood.serve.batch_setup import batch_sizes, choose_max_batch, load_batch_scheduler

    options = dict(target=paths[0], draft=paths[1], progress=False, n_threads=1,
                   cache_dir=tmp_path)
    made = []
    try:
        scheduler, tok = load_batch_scheduler(max_batch=2, **options)
        made.append(scheduler)
        assert isinstance(scheduler.planner, BatchPlanner) and scheduler.max_batch == 2
        assert sorted(scheduler.planner.profile.target_ms) == batch_sizes(32)
        assert len(tok) == scheduler.target.vocab_size
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
