"""`redwood bench --servers`: its command lines, its one HTTP client, its server processes, the
interleaved request loop and the ratios, against stub OpenAI servers (no llama-server build)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from redwood.bench.http_client import complete, get_json
from redwood.bench.prompt_sets import BenchPrompt
from redwood.bench.server_bench import Record, ServerBenchConfig, request_body, run_requests
from redwood.bench.server_process import ServerProcess, free_port
from redwood.bench.server_report import markdown_table, noise_floor, ratios, stray_rounds
from redwood.bench.server_specs import METHODS, ServerSetup, check_methods, command
from redwood.errors import RedwoodError
from stub_openai import serve_in_thread

STUB = str(Path(__file__).with_name("stub_openai.py"))
SETUP = ServerSetup("/m/target.gguf", "/m/draft.gguf", 2, 4096, "/bin/llama-server")


def test_llama_server_command_lines():
    plain = command(METHODS["llama-server"], SETUP, 8123)
    assert plain[:3] == ["/bin/llama-server", "-m", "/m/target.gguf"]
    for flag, value in (("-t", "2"), ("-tb", "2"), ("-c", "4096"), ("-np", "1"),
                        ("--host", "127.0.0.1"), ("--port", "8123")):
        assert plain[plain.index(flag) + 1] == value
    assert "-md" not in plain and "--spec-type" not in plain
    draft = command(METHODS["llama-server-draft-p75"], SETUP, 1)
    assert draft[draft.index("-md") + 1] == "/m/draft.gguf"
    assert draft[draft.index("--spec-type") + 1] == "draft-simple"
    assert draft[draft.index("--spec-draft-p-min") + 1] == "0.75"
    assert "--spec-default" in command(METHODS["llama-server-spec-default"], SETUP, 1)
    again = command(METHODS["llama-server-again"], SETUP, 8124)   # A/A: the same server
    assert again[:again.index("--port") + 1] == plain[:plain.index("--port") + 1]
    slots = command(METHODS["llama-server"], ServerSetup("t", "d", 2, 8192, "/bin/ls", slots=8), 1)
    assert slots[slots.index("-np") + 1] == "8" and slots[slots.index("-c") + 1] == "8192"


def test_redwood_command_lines():
    argv = command(METHODS["redwood-ngram"], SETUP, 9000)
    assert argv[:4] == [sys.executable, "-m", "redwood.cli", "serve"]
    assert argv[argv.index("--drafter") + 1] == "ngram" and argv[argv.index("--max-batch") + 1] == "1"
    assert "--max-batch" not in command(METHODS["redwood"], SETUP, 9000)
    alone = command(METHODS["redwood-ngram-request"], SETUP, 9000)
    assert alone[alone.index("--ngram-memory") + 1] == "0"       # the per-request drafter
    custom = ServerSetup("t.gguf", "d.gguf", 2, redwood_model_args=("--target", "t.gguf",
                                                                   "--draft", "d.gguf"))
    assert command(METHODS["redwood"], custom, 1)[4:8] == ["--target", "t.gguf", "--draft", "d.gguf"]


def test_methods_checked_and_baseline_first():
    assert [m.name for m in check_methods(["redwood", "llama-server-ngram-map-k"])] == [
        "llama-server", "redwood", "llama-server-ngram-map-k"]
    with pytest.raises(RedwoodError, match="unknown server method"):
        check_methods(["vllm"])
    with pytest.raises(RedwoodError, match="twice"):
        check_methods(["redwood", "redwood"])
    with pytest.raises(RedwoodError, match="make llama-server"):
        command(METHODS["llama-server"], ServerSetup("t", "d", 2), 1)


def test_request_body_is_neutral_and_uncached():
    body = request_body(torch.tensor([3, 4]), 0.6, 7, 100, stream=True)
    assert body["prompt"] == [3, 4] and body["cache_prompt"] is False
    assert (body["top_k"], body["min_p"], body["top_p"], body["repeat_penalty"]) == (0, 0.0, 1.0, 1.0)
    assert body["stream_options"] == {"include_usage": True}


def test_cache_prompt_reaches_every_server_only_when_asked():
    """--cache-prompt: every timed request asks the server to keep its prompt cache; without
    it every request says cache_prompt false (the warm-up never asks)."""
    for cache_prompt in (False, True):
        seen = []
        server, url = serve_in_thread(0.0, tokens=2, seen=seen)
        prompts = [BenchPrompt("agent", f"agent-{i}", torch.tensor([5, 6, 7 + i]), "agent")
                   for i in range(2)]
        config = ServerBenchConfig(methods=["llama-server"], rounds=1, max_tokens=2,
                                   cache_prompt=cache_prompt)
        try:
            run_requests(config, prompts, {"llama-server": url}, progress=lambda s: None)
        finally:
            server.shutdown()
        assert [body["cache_prompt"] for body in seen] == [False, cache_prompt, cache_prompt]


def test_client_times_plain_and_streamed_requests():
    seen = []
    server, url = serve_in_thread(0.01, tokens=5, seen=seen)
    try:
        assert get_json(url, "/health")[0] == 200
        plain = complete(url, request_body([1, 2, 3], 0.0, 0, 50, False))
        assert plain.completion_tokens == 5 and plain.text == "xxxxx"
        assert plain.wall_seconds >= 0.05 and plain.ttft_seconds is None
        assert plain.extra["timings"]["draft_n_accepted"] == 3
        streamed = complete(url, request_body([1, 2, 3], 0.0, 0, 50, True))
        assert streamed.completion_tokens == 5 and streamed.text == "xxxxx"
        assert 0.0 < streamed.ttft_seconds < streamed.wall_seconds
        assert seen[0]["prompt"] == [1, 2, 3]
        with pytest.raises(RedwoodError, match="HTTP 400"):
            complete(url, {"prompt": "text", "max_tokens": 1})
    finally:
        server.shutdown()
    assert get_json("http://127.0.0.1:%d" % free_port(), "/health") == (0, None)


def test_server_process_waits_for_health_and_stops(tmp_path):
    port = free_port()
    server = ServerProcess("stub", [sys.executable, STUB, str(port), "0", "3", "0.8"], port,
                           tmp_path / "stub.log", startup_timeout=60)
    with server.start():
        assert server.started_seconds >= 0.8          # it answered 503 until then
        assert complete(server.url, request_body([1], 0.0, 0, 3, False)).completion_tokens == 3
    assert server.process is None


def test_server_process_that_dies_reports_its_log(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('bad model file'); sys.exit(3)"]
    with pytest.raises(RedwoodError, match="exited with code 3(.|\n)*bad model file"):
        ServerProcess("broken", argv, free_port(), tmp_path / "b.log", startup_timeout=60).start()


def test_interleaved_rounds_and_ratios_against_stubs():
    slow, slow_url = serve_in_thread(0.004, tokens=6)
    fast, fast_url = serve_in_thread(0.002, tokens=6)
    prompts = [BenchPrompt("chat", f"chat-{i}", torch.tensor([5, 6, 7 + i]), "chat")
               for i in range(3)]
    config = ServerBenchConfig(methods=["redwood-ngram"], rounds=2, temperatures=(0.0, 0.6),
                               max_tokens=6)
    try:
        records = run_requests(config, prompts, {"llama-server": slow_url,
                                                 "redwood-ngram": fast_url}, progress=lambda s: None)
    finally:
        slow.shutdown()
        fast.shutdown()
    assert len(records) == 2 * 2 * 3 * 2
    first = {(r.round, r.temperature, r.prompt): r.method for r in records if r.order == 0}
    assert len(set(first.values())) == 2               # the order rotates
    summary = ratios(records)
    cell = summary[("chat", 0.0, "redwood-ngram")]
    assert cell["prompts"] == 3 and cell["identical"] == 3
    assert 1.3 < cell["min"]["median"] < 3.0 and cell["min"]["worst"] > 1.2
    assert summary[("chat", 0.6, "llama-server")]["min"]["median"] == 1.0
    table = markdown_table(summary, ["llama-server", "redwood-ngram"], ["chat"], (0.0, 0.6))
    assert "redwood serve --max-batch 1 --drafter ngram" in table and " / " in table


def _record(round_, method, wall, tokens=10):
    return Record(round_, "chat", "p0", 0.0, method, 0, 5, wall, tokens, "stop", None, "t", 1.0)


def test_the_a_a_control_gives_the_noise_floor_line():
    def record(prompt, method, wall):
        return Record(0, "chat", prompt, 0.0, method, 0, 5, wall, 10, "stop", None, "t", 1.0)

    records = [record("p0", "llama-server", 1.0), record("p0", "llama-server-again", 1.05),
               record("p1", "llama-server", 1.0), record("p1", "llama-server-again", 0.9)]
    assert noise_floor(ratios(records[::2] + [record("p0", "redwood", 1.0)])) is None
    line = noise_floor(ratios(records))
    assert "chat T 0: 1.03 (0.95, best 1.11)" in line and "0.95-1.11" in line


def test_stray_rounds_flagged():
    records = [_record(0, "llama-server", 1.0), _record(1, "llama-server", 1.02),
               _record(2, "llama-server", 1.5), _record(2, "redwood", 1.0)]
    strays = stray_rounds(records)
    assert [s["round"] for s in strays] == [2]
    summary = ratios(records)
    assert summary[("chat", 0.0, "redwood")]["min"]["median"] == pytest.approx(1.0)


def test_speculation_pooled_per_set_with_acceptance_by_match():
    from redwood.bench.server_report import speculation_figures, speculation_table

    def redwood(forwards, per_forward, steps, predicted, observed, by_match):
        return {"redwood": {"target_forwards": forwards, "tokens_per_target_forward": per_forward,
                            "predicted_vs_observed": {"steps": steps,
                                                      "predicted_tokens_per_step": predicted,
                                                      "observed_tokens_per_step": observed},
                            "acceptance_by_match": by_match}}
    records = [_record(0, "redwood-ngram", 1.0), _record(1, "redwood-ngram", 1.0),
               _record(0, "llama-server-spec-default", 1.0), _record(0, "llama-server", 1.0)]
    records[0].extra = redwood(10, 2.0, 4, 3.0, 2.5, {"1": [1, 4], "32+": [9, 10]})
    records[1].extra = redwood(30, 1.0, 0, 0.0, 0.0, {"1": [0, 2]})
    records[1].extra["redwood"]["predicted_vs_observed"] = {}
    records[2].extra = {"timings": {"draft_n": 20, "draft_n_accepted": 5}}
    figures = speculation_figures(records)
    ours = figures["chat"]["redwood-ngram"]
    assert ours["tokens_per_forward"] == pytest.approx(50 / 40)    # tokens over forwards
    assert ours["predicted_tokens_per_step"] == 3.0 and ours["observed_tokens_per_step"] == 2.5
    assert ours["acceptance_by_match"] == {"1": [1, 6], "32+": [9, 10]}
    assert figures["chat"]["llama-server-spec-default"] == {"draft_acceptance": 0.25}
    assert "llama-server" not in figures["chat"]                     # nothing to report
    table = speculation_table(figures, ("1", "2", "32+"))
    assert "| chat | redwood-ngram | 1.25 | 3.00 / 2.50 | - | 0.17 (6), -, 0.90 (10) |" in table


def test_config_checks():
    with pytest.raises(RedwoodError):
        ServerBenchConfig(methods=["redwood"], rounds=0).check()
    with pytest.raises(RedwoodError):
        ServerBenchConfig(methods=["nope"]).check()


def test_results_written_with_cpu_and_tables(tmp_path):
    from redwood.bench.server_run import render_markdown, summarise, write

    records = [_record(r, m, w) for r in range(3) for m, w in (("llama-server", 1.0),
                                                               ("redwood-ngram", 0.8))]
    config = ServerBenchConfig(methods=["redwood-ngram"], prompt_sets=("chat",),
                               out_dir=str(tmp_path), machine="test")
    doc = summarise(config, check_methods(config.methods), records,
                    ServerSetup("t", "d", 2), {"chat": {"prompts": 1}}, [])
    doc.update(command="redwood bench --servers redwood-ngram", started="now", finished="now")
    paths = write(config, doc, records)
    text = Path(paths["markdown"]).read_text()
    assert "1.25 (1.25)" in text and "- cpu: " in text and doc["cpu"]["model"]
    assert Path(paths["raw"]).read_text().count('"wall_seconds"') == 6
    assert render_markdown(doc) == text
    from redwood.bench.server_run import rewrite

    again = rewrite(paths["raw"])
    assert again["table"] == doc["table"] and "first round alone" in Path(paths["markdown"]).read_text()


def test_the_report_says_when_learnt_rates_carry_over(tmp_path, monkeypatch):
    """redwood's servers keep their learnt n-gram rates on disk unless told not to, so a fresh
    round is not a fresh start for them: the report says which it was, and a rewrite keeps
    what the run had."""
    from redwood.bench.server_run import render_markdown, rewrite, summarise, write

    records = [_record(r, m, w) for r in range(2) for m, w in (("llama-server", 1.0),
                                                               ("redwood-ngram", 0.8))]
    config = ServerBenchConfig(methods=["redwood-ngram"], prompt_sets=("chat",),
                               out_dir=str(tmp_path), machine="test", fresh_rounds=True)

    def summary(setting: str) -> dict:
        monkeypatch.setenv("REDWOOD_LEARNED_RATES", setting)
        doc = summarise(config, check_methods(config.methods), records,
                        ServerSetup("t", "d", 2), {"chat": {"prompts": 1}}, [])
        doc.update(command="redwood bench", started="now", finished="now")
        return doc

    said = {setting: "learnt n-gram acceptance rates carry over" in render_markdown(summary(setting))
            for setting in ("1", "0")}
    assert said == {"1": True, "0": False}
    paths = write(config, summary("1"), records)
    monkeypatch.setenv("REDWOOD_LEARNED_RATES", "0")
    assert rewrite(paths["raw"])["learned_rates"] is True


def test_unequal_lengths_compared_at_the_methods_length():
    from redwood.bench.server_report import prompt_ratio

    base = {"min_wall": 10.0, "tokens": 100, "median_wall": 10.0, "median_tokens": 100,
            "decode_s_per_token": 0.03, "rate_min": 10.0, "rate_median": 10.0}
    same = dict(base, min_wall=8.0, median_wall=8.0, decode_s_per_token=None)
    assert prompt_ratio(base, same, "min") == pytest.approx(1.25)
    longer = dict(same, tokens=200, median_tokens=200, rate_min=25.0, rate_median=25.0)
    assert prompt_ratio(base, longer, "min") == pytest.approx(13.0 / 8.0)
    untimed = dict(base, decode_s_per_token=None)
    assert prompt_ratio(untimed, longer, "median") == pytest.approx(25.0 / 10.0)


def test_rounds_of_other_lengths_are_taken_at_their_best_carried_ratio():
    from redwood.bench.server_report import prompt_ratio

    # the baseline: 170 tokens in 6.12 s at 36 ms a decoded token (chat-1 at T 0.6)
    base = {"min_wall": 6.12, "tokens": 170, "median_wall": 6.45, "median_tokens": 170,
            "decode_s_per_token": 0.036, "rate_min": 170 / 6.12}
    rounds = [(7.88, 202), (7.67, 177), (7.71, 202)]    # the fastest round is the short, slow one
    method = {"min_wall": 7.67, "tokens": 177, "median_wall": 7.71, "median_tokens": 202,
              "decode_s_per_token": None, "rate_min": 177 / 7.67,
              "round_walls": rounds}
    carried = [(6.12 + (n - 170) * 0.036) / wall for wall, n in rounds]
    assert prompt_ratio(base, method, "min") == pytest.approx(max(carried))       # 0.94
    assert prompt_ratio(base, dict(method, round_walls=None), "min") == pytest.approx(carried[1])
    # one length in every round: the best round is the fastest one, as before
    equal = dict(method, round_walls=[(8.0, 170), (7.0, 170), (9.0, 170)], min_wall=7.0, tokens=170)
    assert prompt_ratio(base, equal, "min") == pytest.approx(6.12 / 7.0)


def test_paused_server_answers_only_after_resume(tmp_path):
    port = free_port()
    server = ServerProcess("stub", [sys.executable, STUB, str(port), "0"], port,
                           tmp_path / "stub.log", startup_timeout=60)
    with server.start():
        server.pause()
        assert get_json(server.url, "/health", timeout=0.5) == (0, None)
        server.resume()
        assert get_json(server.url, "/health", timeout=5.0)[0] == 200
        server.pause()                                   # stop() must end a paused process
    assert server.process is None


def test_an_interrupted_run_keeps_the_prompts_every_method_answered():
    """Ctrl-C during a run: the records of the prompts every method answered are returned, for
    the report to be written."""
    a, a_url = serve_in_thread(0.001, tokens=4)
    b, b_url = serve_in_thread(0.001, tokens=4)
    prompts = [BenchPrompt("chat", f"chat-{i}", torch.tensor([5, 6, 7 + i]), "chat")
               for i in range(3)]
    config = ServerBenchConfig(methods=["redwood-ngram"], rounds=3, max_tokens=4)
    lines = []

    def progress(line):
        lines.append(line)
        if len(lines) == 2:          # after prompt 2 of round 1: interrupt the next request
            raise KeyboardInterrupt

    try:
        records = run_requests(config, prompts, {"llama-server": a_url, "redwood-ngram": b_url},
                               progress=progress)
    finally:
        a.shutdown()
        b.shutdown()
    assert len(records) == 2 * 2 and {r.prompt for r in records} == {"chat-0", "chat-1"}
    assert "interrupted: keeping the 2 prompts" in lines[-1]


class StartedStub:
    """A started server as measure() uses one: its url; pausing does nothing."""

    def __init__(self, url):
        self.url = url

    def pause(self):
        pass

    def resume(self):
        pass


def stub_servers(methods, stubs: list) -> dict:
    """start_servers' stand-in: a stub OpenAI server per method (kept in `stubs` to shut)."""
    out = {}
    for m in methods:
        server, url = serve_in_thread(0.0, tokens=3)
        stubs.append(server)
        out[m.name] = StartedStub(url)
    return out


def measure_two_prompts(config, stubs: list, tmp_path) -> list:
    """server_run.measure over two short chat prompts; the stub servers shut afterwards."""
    from redwood.bench import server_run

    prompts = [BenchPrompt("chat", f"chat-{i}", torch.tensor([5, 6, 7 + i]), "chat")
               for i in range(2)]
    try:
        return server_run.measure(config, check_methods(config.methods), SETUP, prompts,
                                  tmp_path)
    finally:
        for server in stubs:
            server.shutdown()


@pytest.mark.parametrize("fresh", [False, True])
def test_fresh_rounds_start_the_servers_afresh_for_each_temperature(monkeypatch, tmp_path, fresh):
    """Two temperatures in a round: with --fresh-rounds each (round, temperature) gets servers
    of its own, so no request at T 0.6 runs on a server that answered the same prompt at T 0;
    the records keep the order of one long run (round, then temperature, then prompt)."""
    from redwood.bench import server_run

    stubs = []

    def start(methods, setup, log_dir):
        return stub_servers(methods, stubs)

    seen = []
    real_run = server_run.run_requests

    def run(config, prompts, urls, **kwargs):
        seen.append((tuple(kwargs["rounds"]), tuple(kwargs["temperatures"])))
        return real_run(config, prompts, urls, **kwargs)

    monkeypatch.setattr(server_run, "start_servers", start)
    monkeypatch.setattr(server_run, "stop_servers", lambda servers: None)
    monkeypatch.setattr(server_run, "run_requests", run)
    config = ServerBenchConfig(methods=["redwood"], rounds=2, max_tokens=3,
                               temperatures=(0.0, 0.6), fresh_rounds=fresh)
    records = measure_two_prompts(config, stubs, tmp_path)
    if fresh:
        assert seen == [((0,), (0.0,)), ((0,), (0.6,)), ((1,), (0.0,)), ((1,), (0.6,))]
    else:
        assert seen == [((0, 1), (0.0, 0.6))]
    assert [(r.round, r.temperature) for r in records] == [
        (r, t) for r in range(2) for t in (0.0, 0.6) for _ in range(4)]
    notes = server_run.run_notes(config)
    assert (notes == []) == fresh
    assert not server_run.run_notes(ServerBenchConfig(methods=["redwood"], temperatures=(0.6,)))


@pytest.mark.parametrize("fresh", [False, True])
def test_fresh_rounds_start_every_server_before_each_round(monkeypatch, tmp_path, fresh):
    """--fresh-rounds: each round runs on servers started for it (so none carries what it
    learnt into the next round); without it the servers start once. Records keep their round
    numbers and the methods rotate as in one long run."""
    from redwood.bench import server_run

    starts, stops, stubs = [], [], []

    def start(methods, setup, log_dir):
        starts.append([m.name for m in methods])
        return stub_servers(methods, stubs)

    monkeypatch.setattr(server_run, "start_servers", start)
    monkeypatch.setattr(server_run, "stop_servers", lambda servers: stops.append(list(servers)))
    config = ServerBenchConfig(methods=["redwood"], rounds=3, max_tokens=3, fresh_rounds=fresh)
    records = measure_two_prompts(config, stubs, tmp_path)
    assert len(starts) == len(stops) == (3 if fresh else 1)
    assert starts[0] == ["llama-server", "redwood"]
    assert [r.round for r in records] == [r for r in range(3) for _ in range(4)]
    assert [r.method for r in records[:4]] == ["llama-server", "redwood", "redwood", "llama-server"]
    assert [r.method for r in records[4:6]] == ["redwood", "llama-server"]     # round 2 rotated
