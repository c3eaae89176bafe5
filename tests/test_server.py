"""The OpenAI-compatible server, end to end: uvicorn in a background thread on 127.0.0.1, the
official `openai` client, and the real `redwood.Engine` on tiny random Qwen2 models whose
vocabulary is the shipped Qwen tokenizer's, so text round-trips.

Every wait is a bounded poll (a deadline, then a failure message); nothing asserts a duration.
"""
from __future__ import annotations

import contextlib
import copy
import json
import queue
import re
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import torch
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from redwood import Engine, Tree
from redwood.decode.detokenize import IncrementalText
from redwood.serve.app import ServerConfig, create_app
from tiny import tiny_model

QWEN_VOCAB = 151_936
TREE = Tree([-1, 0, 0, 1, 1, 2, 3])       # 7 nodes, 3 draft levels
DEADLINE_S = 60.0                           # bound for every poll loop (never reached when healthy)
PROMPTS = ["def fibonacci(n):", "The capital of France is", "import numpy as np\n",
           "Once upon a time", "SELECT * FROM", "class Stack:"]


# --- fixtures ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(shipped_tokenizer):
    assert len(shipped_tokenizer) == QWEN_VOCAB
    return shipped_tokenizer


def _near_copy(model, noise: float, seed: int):
    """A draft that agrees with `model` often but not always: its weights plus noise."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=generator))
    return draft


@pytest.fixture(scope="module")
def pair(tokenizer):
    target = tiny_model("qwen2", vocab_size=QWEN_VOCAB, seed=11, hidden_size=32, num_layers=2,
                        max_positions=1024)
    for cfg in (target.config, target.generation_config):
        cfg.eos_token_id = tokenizer.eos_token_id
    return target, _near_copy(target, noise=0.1, seed=12)


@pytest.fixture(scope="module")
def engine(pair):
    return Engine(*pair, TREE)


@contextlib.contextmanager
def running(app):
    """Serve `app` on 127.0.0.1 (a port the OS picks) in a background thread."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _wait_for(lambda: server.started or not thread.is_alive(), "the server to start")
    assert server.started, "uvicorn failed to start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(DEADLINE_S)
        assert not thread.is_alive(), "server did not shut down"


def _wait_for(condition, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def base_url(engine, tokenizer):
    app = create_app(engine, tokenizer, ServerConfig(model_name="tiny-qwen", max_queue=32))
    with running(app) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


# --- helpers -------------------------------------------------------------------------------

def offline(engine, ids, max_tokens, **options) -> list[int]:
    return engine.generate(torch.tensor([ids]), max_tokens, **options).tokens


def decode(tokenizer, tokens) -> str:
    return tokenizer.decode(tokens, skip_special_tokens=True)


def chat_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


def scrape(base_url, headers=None) -> dict:
    """Every sample of /metrics as {(name, sorted label items): value}."""
    response = httpx.get(base_url + "/metrics", headers=headers or {})
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def metric(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def assert_error_body(response, status: int, param: str | None = None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


# --- detokenisation (no server) -----------------------------------------------------------

def test_incremental_text_never_emits_half_a_character(tokenizer):
    text = "naïve café 🦜🪿𓀀 ꙮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 done"
    ids = tokenizer(text).input_ids
    # the test means something only if some character spans several tokens
    assert any(decode(tokenizer, ids[:i]).endswith("\ufffd") for i in range(1, len(ids)))
    inc = IncrementalText(tokenizer)
    deltas = [inc.add([t]) for t in ids] + [inc.finish()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text


def test_incremental_text_stop_string_spanning_tokens(tokenizer):
    text = "alpha beta gamma delta epsilon"
    ids = tokenizer(text).input_ids
    inc = IncrementalText(tokenizer, stop=["ma del"])
    deltas = []
    for t in ids:
        deltas.append(inc.add([t]))
        assert "alpha beta gam".startswith("".join(deltas))     # never a piece of the stop
    assert inc.stopped and "".join(deltas) + inc.finish() == "alpha beta gam"
    # usage counts the fewest tokens whose text contains the stop string
    assert "ma del" in decode(tokenizer, ids[:inc.n_tokens])
    assert "ma del" not in decode(tokenizer, ids[:inc.n_tokens - 1])


def test_incremental_text_releases_a_false_stop_prefix(tokenizer):
    inc = IncrementalText(tokenizer, stop=["END"])
    ids = tokenizer("x = E + 1").input_ids
    out = "".join(inc.add([t]) for t in ids) + inc.finish()
    assert out == "x = E + 1" and not inc.stopped


# --- prompt ids: the server tokenises as the CLI does (no server) ----------------------------

class BosTokenizer:
    """The Qwen tokenizer, except that it adds a BOS as Llama's does: the case where a server
    and a CLI that encode prompts differently would feed the model different ids."""

    def __init__(self, inner):
        self.inner, self.bos_token_id = inner, inner.convert_tokens_to_ids("<|endoftext|>")

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, text, add_special_tokens=True, **kwargs):
        ids = self.inner(text, add_special_tokens=False, **kwargs)["input_ids"]
        return {"input_ids": [self.bos_token_id] * add_special_tokens + list(ids)}


@pytest.mark.parametrize("with_bos", [False, True])
@pytest.mark.parametrize("text", ["def fibonacci(n):", "  leading spaces\n", "naïve café"])
def test_server_prompt_ids_equal_the_clis(tokenizer, with_bos, text):
    from redwood.prompts import encode_prompt
    from redwood.serve.openai_requests import parse_request

    tok = BosTokenizer(tokenizer) if with_bos else tokenizer
    limits = dict(tokenizer=tok, context=1024, vocab_size=QWEN_VOCAB, default_max_tokens=4)
    completion = parse_request({"prompt": text}, "completion", **limits).prompt_ids
    chat = parse_request({"messages": [{"role": "user", "content": text}]}, "chat",
                         **limits).prompt_ids
    assert completion == encode_prompt(tok, text).tolist()
    assert chat == encode_prompt(tok, text, chat=True).tolist()
    plain = tokenizer(text, add_special_tokens=False).input_ids
    # raw text gets the tokenizer's BOS once (Qwen2's: none); the chat template's own
    # special tokens are never doubled by a BOS
    assert completion == [tok.bos_token_id] * with_bos + plain
    assert chat == chat_ids(tokenizer, [{"role": "user", "content": text}])


# --- OpenAI client: completions and chat ----------------------------------------------------

def test_models_and_health(base_url, client):
    assert [m.id for m in client.models.list().data] == ["tiny-qwen"]
    health = httpx.get(base_url + "/health").json()
    assert health["status"] == "ok"


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_completion_greedy_equals_offline(client, engine, tokenizer, prompt):
    ids = tokenizer(prompt).input_ids
    expected = offline(engine, ids, 16)
    response = client.completions.create(model="tiny-qwen", prompt=prompt, max_tokens=16,
                                         temperature=0)
    choice = response.choices[0]
    assert choice.text == decode(tokenizer, expected)
    assert choice.finish_reason == "length"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens,
            response.usage.total_tokens) == (len(ids), 16, len(ids) + 16)
    stats = response.model_extra["redwood"]
    assert stats["method"] == "sequoia" and stats["target_forwards"] >= 1
    assert {"prefill_seconds", "decode_seconds"} <= set(stats)     # the engine's own timings
    assert stats["tokens_per_target_forward"] == pytest.approx(16 / stats["target_forwards"],
                                                               abs=1e-3)


def test_usage_reports_cached_tokens_and_cache_prompt_is_checked(client, base_url):
    """Every response says how many prompt tokens came from the prompt cache (the transformers
    backend keeps none between requests: 0); llama-server's `cache_prompt` field is accepted
    and type-checked like every other field."""
    response = client.completions.create(model="tiny-qwen", prompt=PROMPTS[1], max_tokens=4,
                                         temperature=0, extra_body={"cache_prompt": False})
    assert response.usage.prompt_tokens_details.cached_tokens == 0
    bad = httpx.post(f"{base_url}/v1/completions",
                     json={"prompt": "x", "max_tokens": 2, "cache_prompt": "no"}, timeout=60)
    assert bad.status_code == 400 and "cache_prompt" in bad.text


def test_chat_verb_keeps_the_conversation(monkeypatch, engine, tokenizer):
    """`redwood chat`: two turns on one engine; the second prompt holds the first exchange,
    and each turn prints its speed line."""
    from redwood.cli import chat, textgen
    from redwood.decode.params import SamplingParams

    monkeypatch.setattr(textgen, "load_engine", lambda config, temperature=0.0: (engine, tokenizer))
    lines = iter(["Say hi", "And again", ""])
    printed, prompts = [], []
    original = engine.stream

    def stream(ids, *args, **kwargs):
        prompts.append(ids.tolist())
        return original(ids, *args, **kwargs)
    monkeypatch.setattr(engine, "stream", stream)
    code = chat.run_chat(None, SamplingParams(max_new_tokens=6), system="Be brief.",
                         read=lambda prompt: next(lines),
                         write=lambda *a, **k: printed.append(" ".join(map(str, a))))
    assert code == 0 and len(prompts) == 2
    common = next((i for i, (a, b) in enumerate(zip(*prompts)) if a != b), len(prompts[0]))
    assert common >= len(prompts[0]) - 2 and len(prompts[1]) > len(prompts[0])   # it extends
    speed = [line for line in printed if "tokens/s, whole turn" in line]
    assert len(speed) == 2 and "cached)" in speed[0]


def test_completion_streaming_equals_offline(client, engine, tokenizer):
    ids = tokenizer(PROMPTS[2]).input_ids
    expected = decode(tokenizer, offline(engine, ids, 20))
    chunks = list(client.completions.create(model="tiny-qwen", prompt=PROMPTS[2], max_tokens=20,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == expected
    assert sum(1 for t in texts if t) > 1           # it streamed, not one blob
    finals = [c.choices[0].finish_reason for c in chunks
              if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].usage.completion_tokens == 20 and chunks[-1].usage.prompt_tokens == len(ids)


def test_chat_greedy_equals_offline(client, engine, tokenizer):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Write a haiku about trees."}]
    ids = chat_ids(tokenizer, messages)
    expected = decode(tokenizer, offline(engine, ids, 12))
    response = client.chat.completions.create(model="tiny-qwen", messages=messages,
                                              max_tokens=12, temperature=0)
    assert response.object == "chat.completion"
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == expected
    assert response.usage.prompt_tokens == len(ids) and response.usage.completion_tokens == 12

    stream = client.chat.completions.create(model="tiny-qwen", messages=messages, max_tokens=12,
                                            temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].model_extra["redwood"]["target_forwards"] >= 1


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_text(client, engine, tokenizer, stream):
    ids = tokenizer(PROMPTS[3]).input_ids
    tokens = offline(engine, ids, 24)
    full = decode(tokenizer, tokens)
    stop = full[len(full) // 2: len(full) // 2 + 3]
    cut = full.find(stop)
    needed = next(m for m in range(1, 25) if stop in decode(tokenizer, tokens[:m]))
    kwargs = dict(model="tiny-qwen", prompt=PROMPTS[3], max_tokens=24, temperature=0,
                  stop=["\u2603 never", stop])
    if stream:
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True},
                                                **kwargs))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage
    else:
        response = client.completions.create(**kwargs)
        choice, usage = response.choices[0], response.usage
        text, finish = choice.text, choice.finish_reason
    assert text == full[:cut]
    assert finish == "stop"
    assert usage.completion_tokens == needed


def test_eos_finishes_with_stop(engine, pair, tokenizer):
    """A model whose EOS is the 6th greedy token stops there with finish_reason "stop"."""
    ids = tokenizer(PROMPTS[4]).input_ids
    tokens = offline(engine, ids, 12)
    eos = next(t for i, t in enumerate(tokens) if i >= 3 and t not in tokens[:i])
    n = tokens.index(eos) + 1
    target = copy.deepcopy(pair[0])
    for cfg in (target.config, target.generation_config):
        cfg.eos_token_id = eos
    app = create_app(Engine(target, pair[1], TREE), tokenizer, ServerConfig())
    with running(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        response = client.completions.create(model="m", prompt=PROMPTS[4], max_tokens=12,
                                             temperature=0)
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.completion_tokens == n
    assert response.choices[0].text == decode(tokenizer, tokens[:n])


def test_sampling_with_seed_is_reproducible(client):
    kwargs = dict(model="tiny-qwen", prompt=PROMPTS[0], max_tokens=10, temperature=0.8,
                  top_p=0.9, seed=1234)
    first = client.completions.create(**kwargs).choices[0].text
    assert client.completions.create(**kwargs).choices[0].text == first


# --- bad requests ------------------------------------------------------------------------

_COMPLETION = {"model": "tiny-qwen", "prompt": "hello", "max_tokens": 4}
_CHAT = {"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
_BAD = [
    ("completions", {"temperature": 2.5}, "temperature"),
    ("completions", {"temperature": -0.1}, "temperature"),
    ("completions", {"temperature": "hot"}, "temperature"),
    ("completions", {"top_p": 0}, "top_p"),
    ("completions", {"top_p": 1.5}, "top_p"),
    ("completions", {"max_tokens": 0}, "max_tokens"),
    ("completions", {"max_tokens": -3}, "max_tokens"),
    ("completions", {"max_tokens": "10"}, "max_tokens"),
    ("completions", {"max_tokens": 4.5}, "max_tokens"),
    ("completions", {"max_tokens": 5000}, "max_tokens"),
    ("completions", {"prompt": ""}, "prompt"),
    ("completions", {"prompt": None}, "prompt"),
    ("completions", {"prompt": 42}, "prompt"),
    ("completions", {"prompt": ["a", "b"]}, "prompt"),
    ("completions", {"prompt": [1, -2]}, "prompt"),
    ("completions", {"n": 2}, "n"),
    ("completions", {"best_of": 3}, "best_of"),
    ("completions", {"logprobs": 5}, "logprobs"),
    ("completions", {"echo": True}, "echo"),
    ("completions", {"stop": 7}, "stop"),
    ("completions", {"stop": [""]}, "stop"),
    ("completions", {"seed": "x"}, "seed"),
    ("completions", {"stream": "yes"}, "stream"),
    ("completions", {"messages": [{"role": "user", "content": "hi"}]}, "messages"),
    ("chat/completions", {"messages": []}, "messages"),
    ("chat/completions", {"messages": None}, "messages"),
    ("chat/completions", {"messages": "hi"}, "messages"),
    ("chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ("chat/completions", {"n": 3}, "n"),
    ("chat/completions", {"logprobs": True}, "logprobs"),
    ("chat/completions", {"tools": [{"type": "function"}]}, "tools"),
    ("chat/completions", {"max_completion_tokens": 0}, "max_completion_tokens"),
]


def test_invalid_requests_get_openai_errors_and_the_server_keeps_serving(base_url, client):
    with httpx.Client(base_url=base_url, timeout=60) as http:
        for endpoint, override, param in _BAD:
            body = {**(_COMPLETION if endpoint == "completions" else _CHAT), **override}
            body = {k: v for k, v in body.items() if v is not None}    # None: leave it out
            response = http.post(f"/v1/{endpoint}", json=body)
            error = assert_error_body(response, 400, param)
            assert param.split("[")[0] in error["message"]
        # raw bodies: NaN (Python's json accepts it), not JSON at all, not an object
        nan = json.dumps({**_COMPLETION, "temperature": float("nan")})
        as_json = {"content-type": "application/json"}
        assert_error_body(http.post("/v1/completions", content=nan, headers=as_json), 400,
                          "temperature")
        assert_error_body(http.post("/v1/completions", content=b"{not json"), 400)
        assert_error_body(http.post("/v1/completions", json=[1, 2]), 400)
        assert_error_body(http.get("/v1/nothing-here"), 404)
    with pytest.raises(openai.BadRequestError, match="n"):
        client.completions.create(model="tiny-qwen", prompt="hi", max_tokens=2, n=2)
    ok = client.completions.create(model="tiny-qwen", prompt="hi", max_tokens=3, temperature=0)
    assert ok.usage.completion_tokens == 3


class FailingEngine:
    """The real engine, except that requests asking for exactly 7 tokens blow up mid-stream."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream(self, input_ids, max_new_tokens, **options):
        stream = self.engine.stream(input_ids, max_new_tokens, **options)
        if max_new_tokens != 7:
            return stream

        def explode():
            yield next(iter(stream))
            raise RuntimeError("simulated engine failure")
        return _IterStream(explode(), stream)


class _IterStream:
    def __init__(self, steps, inner):
        self.steps, self.inner, self.result = steps, inner, None

    def __iter__(self):
        return self.steps

    def close(self):
        self.steps.close()
        self.inner.close()


def test_a_failing_request_gets_500_and_the_server_keeps_serving(engine, tokenizer):
    app = create_app(FailingEngine(engine), tokenizer, ServerConfig())
    ids = tokenizer(PROMPTS[5]).input_ids
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        failed = http.post("/v1/completions", json={**_COMPLETION, "max_tokens": 7})
        error = assert_error_body(failed, 500)
        assert error["type"] == "server_error" and "simulated engine failure" in error["message"]
        body = {"prompt": PROMPTS[5], "max_tokens": 5, "temperature": 0}
        ok = http.post("/v1/completions", json=body).json()
        assert ok["choices"][0]["text"] == decode(tokenizer, offline(engine, ids, 5))
        samples = scrape(url)
    assert metric(samples, "redwood_requests_total", endpoint="/v1/completions", status="500") == 1
    assert metric(samples, "redwood_requests_total", endpoint="/v1/completions", status="200") == 1


def test_a_bundle_style_drafting_choice_is_used_per_request(engine, tokenizer):
    """drafting_for_temperature (what `serve --tree auto` installs) picks each request's tree
    and pruning threshold; greedy output still equals the engine's own."""
    asked = []

    def drafting(temperature):
        asked.append(temperature)
        return Tree(list(range(-1, 11))), 0.95      # a deep chain, pruned hard
    app = create_app(engine, tokenizer, ServerConfig(drafting_for_temperature=drafting))
    ids = tokenizer(PROMPTS[0]).input_ids
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        body = {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0}
        reply = http.post("/v1/completions", json=body).json()
    assert asked == [0.0]
    assert reply["choices"][0]["text"] == decode(tokenizer, offline(engine, ids, 12))
    assert 0 < reply["redwood"]["draft_tokens_per_step"] < 10      # pruned below the 10-token chain


def test_api_key_required_when_configured(engine, tokenizer):
    app = create_app(engine, tokenizer, ServerConfig(api_key="s3cret", default_max_tokens=3))
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            assert_error_body(http.post("/v1/completions", json=_COMPLETION, headers=headers), 401)
            assert_error_body(http.get("/v1/models", headers=headers), 401)
            assert_error_body(http.get("/metrics", headers=headers), 401)
        assert http.get("/health").status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0).models.list()
        good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        short = good.completions.create(model="m", prompt="hi", max_tokens=2)
        assert short.usage.completion_tokens == 2
        # no max_tokens: the server's default applies
        assert good.completions.create(model="m", prompt="hi").usage.completion_tokens == 3


# --- disconnects, concurrency, the queue ----------------------------------------------------

def test_disconnect_mid_stream_frees_the_engine(base_url, client, engine, tokenizer):
    # offline first: the engine is not thread-safe, so never run it beside the server's worker
    expected = decode(tokenizer, offline(engine, tokenizer(PROMPTS[1]).input_ids, 8))
    before = scrape(base_url)
    long_request = {"prompt": PROMPTS[0], "max_tokens": 900, "temperature": 0, "stream": True}
    with httpx.Client(base_url=base_url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=long_request) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                    break               # got the first text; now hang up mid-stream
    _wait_for(lambda: metric(scrape(base_url), "redwood_requests_total",
                             endpoint="/v1/completions", status="499")
              > metric(before, "redwood_requests_total", endpoint="/v1/completions", status="499"),
              "the server to notice the disconnect")
    # the next request is answered correctly, and the abandoned one stopped early
    response = client.completions.create(model="tiny-qwen", prompt=PROMPTS[1], max_tokens=8,
                                         temperature=0)
    assert response.choices[0].text == expected
    after = scrape(base_url)
    generated = metric(after, "redwood_generated_tokens_total") - metric(
        before, "redwood_generated_tokens_total")
    assert generated - 8 < 900
    assert metric(after, "redwood_requests_in_progress") == 0


def test_twenty_concurrent_requests_all_answered_correctly(base_url, engine, tokenizer):
    jobs = [(f"{PROMPTS[i % len(PROMPTS)]} #{i}", 4 + i % 5, i % 2 == 1) for i in range(20)]
    expected = [decode(tokenizer, offline(engine, tokenizer(p).input_ids, n)) for p, n, _ in jobs]
    answers: dict[int, str] = {}
    errors: list[BaseException] = []

    def ask(i):
        prompt, n, stream = jobs[i]
        try:
            c = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=300)
            if stream:
                answers[i] = "".join(ch.choices[0].text for ch in c.completions.create(
                    model="tiny-qwen", prompt=prompt, max_tokens=n, temperature=0, stream=True))
            else:
                answers[i] = c.completions.create(model="tiny-qwen", prompt=prompt, max_tokens=n,
                                                  temperature=0).choices[0].text
        except BaseException as exc:    # reported below, with the request that failed
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert [answers.get(i) for i in range(20)] == expected


class GatedEngine:
    """The real engine behind a gate: streams wait for `gate` before their first step."""

    def __init__(self, engine):
        self.engine, self.gate = engine, threading.Event()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream(self, *args, **kwargs):
        stream = self.engine.stream(*args, **kwargs)
        gate = self.gate

        def gated():
            assert gate.wait(DEADLINE_S), "test gate never opened"
            yield from stream
        return _IterStream(gated(), stream)


def test_full_queue_answers_429_and_queued_requests_still_complete(engine, tokenizer):
    gated = GatedEngine(engine)
    app = create_app(gated, tokenizer, ServerConfig(max_queue=2))
    results: dict[int, httpx.Response] = {}

    def post(i):
        with httpx.Client(timeout=120) as http:
            results[i] = http.post(url + "/v1/completions",
                                   json={"prompt": PROMPTS[i], "max_tokens": 4, "temperature": 0})

    with running(app) as url:
        threads = []
        for i, waiting in ((0, 0), (1, 1), (2, 2)):    # one generating, then two waiting
            threads.append(threading.Thread(target=post, args=(i,)))
            threads[-1].start()
            _wait_for(lambda: metric(scrape(url), "redwood_requests_in_progress") == 1
                      and metric(scrape(url), "redwood_queue_length") == waiting,
                      f"{waiting} requests to be queued")
        rejected = httpx.post(url + "/v1/completions", json=_COMPLETION, timeout=60)
        error = assert_error_body(rejected, 429)
        assert error["type"] == "rate_limit_error" and "busy" in error["message"]
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0).completions.create(
                model="m", prompt="hi", max_tokens=2)
        gated.gate.set()
        for t in threads:
            t.join(120)
        samples = scrape(url)
    for i in range(3):
        assert results[i].status_code == 200
        expected = decode(tokenizer, offline(engine, tokenizer(PROMPTS[i]).input_ids, 4))
        assert results[i].json()["choices"][0]["text"] == expected
    assert metric(samples, "redwood_requests_total", endpoint="/v1/completions", status="429") == 2


# --- metrics -----------------------------------------------------------------------------------

def test_metrics_parse_and_move_with_traffic(base_url, client, tokenizer):
    before = scrape(base_url)
    response = client.completions.create(model="tiny-qwen", prompt=PROMPTS[5], max_tokens=20,
                                         temperature=0)
    after = scrape(base_url)

    def moved(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    stats = response.model_extra["redwood"]
    assert moved("redwood_requests_total", endpoint="/v1/completions", status="200") == 1
    assert moved("redwood_generated_tokens_total") == 20
    assert moved("redwood_prompt_tokens_total") == len(tokenizer(PROMPTS[5]).input_ids)
    assert moved("redwood_target_forwards_total") == stats["target_forwards"]
    assert moved("redwood_tokens_per_target_forward_count") == stats["target_forwards"]
    assert moved("redwood_tokens_per_target_forward_sum") == 20
    assert moved("redwood_time_to_first_token_seconds_count") == 1
    assert moved("redwood_time_per_output_token_seconds_count") >= 1
    depth1 = moved("redwood_accepted_at_depth_total", depth="1")
    assert depth1 == pytest.approx(stats["acceptance_by_depth"][0] * stats["target_forwards"]) \
        if stats["acceptance_by_depth"] else depth1 == 0
    # the near-copy draft is accepted often: some step reached depth 1 at some point
    assert metric(after, "redwood_accepted_at_depth_total", depth="1") > 0
    assert ("redwood_queue_length", ()) in after


# --- the CLI ---------------------------------------------------------------------------------

def test_cli_serve_end_to_end(tmp_path, pair, engine, tokenizer):
    """`redwood serve --target --draft --tree --port 0 --api-key` in a subprocess."""
    pair[0].save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    pair[1].save_pretrained(tmp_path / "draft")
    TREE.save(tmp_path / "tree.json")
    command = [sys.executable, "-m", "redwood.cli", "serve", "--target", str(tmp_path / "target"),
               "--draft", str(tmp_path / "draft"), "--tree", str(tmp_path / "tree.json"),
               "--port", "0", "--api-key", "k3y", "--served-name", "tiny"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    try:
        url, log = None, []
        deadline = time.monotonic() + 3 * DEADLINE_S
        while url is None:
            assert time.monotonic() < deadline and proc.poll() is None, "".join(log)
            with contextlib.suppress(queue.Empty):
                log.append(lines.get(timeout=0.5))
                found = re.search(r"running on (http://127\.0\.0\.1:\d+)", log[-1])
                url = found and found.group(1)
        client = openai.OpenAI(base_url=url + "/v1", api_key="k3y", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        ids = tokenizer(PROMPTS[0]).input_ids
        response = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=6,
                                             temperature=0)
        assert response.choices[0].text == decode(tokenizer, offline(engine, ids, 6))
        assert httpx.get(url + "/v1/models").status_code == 401
    finally:
        proc.terminate()
        proc.wait(DEADLINE_S)


def test_cli_serve_refuses_bad_arguments(capsys):
    from redwood.cli.main import main

    assert main(["serve", "--tree", "no/such/tree.json"]) == 2
    assert main(["serve", "--port", "70000"]) == 2
    assert main(["serve", "--model", "qwen2.5-coder", "--target", "x", "--draft", "y"]) == 2
    err = capsys.readouterr().err
    assert "no/such/tree.json does not exist" in err and "--port" in err and "either --model" in err


def test_step_metrics_are_published_on_render_and_stay_bounded():
    """observe_step keeps steps in plain Python until /metrics renders (serve/metrics.py);
    without a scrape they are published every PUBLISH_EVERY steps, so memory stays bounded,
    and a render counts every step."""
    from redwood.serve.metrics import PUBLISH_EVERY, ServerMetrics

    metrics = ServerMetrics()
    for _ in range(PUBLISH_EVERY - 1):
        metrics.observe_step(2, 0.01)
    assert len(metrics._steps) == PUBLISH_EVERY - 1
    metrics.observe_step(1, None)
    assert metrics._steps == []                       # published without a scrape
    metrics.observe_step(3, 0.03)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(metrics.render().decode())
               for s in family.samples}
    assert samples[("redwood_generated_tokens_total", ())] == 2 * (PUBLISH_EVERY - 1) + 1 + 3
    assert samples[("redwood_target_forwards_total", ())] == PUBLISH_EVERY + 1
    assert samples[("redwood_accepted_at_depth_total", (("depth", "1"),))] == PUBLISH_EVERY
    assert samples[("redwood_accepted_at_depth_total", (("depth", "2"),))] == 1
    assert samples[("redwood_time_per_output_token_seconds_count", ())] == \
        2 * (PUBLISH_EVERY - 1) + 3
