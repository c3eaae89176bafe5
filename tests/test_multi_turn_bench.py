"""benchmarks/multi_turn.py: rounds on freshly started servers and the per-session summary."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest


def _script():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "multi_turn.py"
    spec = importlib.util.spec_from_file_location("bench_script_multi_turn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _session_rows(method, round_, total, answers=("a", "b"), ttft=(0.5, 0.4)):
    rows = [{"workload": "chat", "session": 0, "method": method, "turn": t, "round": round_,
             "answer": answers[t], "ttft_seconds": ttft[t], "wall_seconds": total / 2}
            for t in range(2)]
    return rows + [{"workload": "chat", "session": 0, "method": method, "turn": "all",
                    "round": round_, "wall_seconds": total}]


def test_summary_gives_median_worst_and_best_of_rounds():
    script = _script()
    rows = []
    for r, (base, mine) in enumerate([(10.0, 8.0), (12.0, 12.0), (9.0, 10.0)]):
        rows += _session_rows("server", r, base)
        rows += _session_rows("redwood", r, mine, answers=("a", "b" if r else "x"),
                              ttft=(0.5, 0.8))
    entry = script.summarise(rows, ["server", "redwood"])["chat/0"]["redwood"]
    assert entry["rounds_seconds"] == [8.0, 12.0, 10.0]
    assert entry["seconds"] == 10.0 and entry["best_seconds"] == 8.0
    assert entry["speed_vs_base"] == 1.0                       # ratios 1.25, 1.0, 0.9
    assert entry["worst_round_speed_vs_base"] == 0.9
    assert entry["best_speed_vs_base"] == pytest.approx(9.0 / 8.0, abs=1e-3)
    assert entry["ttft_turns_2_on_median_s"] == 0.8            # only turn index 1 counts
    assert entry["ttft_speed_vs_base"] == 0.5
    assert entry["answers_equal"] == "5/6"                     # round 0's second answer differs
    assert script.summarise(rows, ["server", "redwood"])["chat/0"]["server"][
        "speed_vs_base"] == 1.0


def test_every_round_starts_fresh_servers_and_rotates_who_goes_first(tmp_path, monkeypatch):
    import redwood.bench.server_bench as server_bench
    import redwood.bench.server_run as server_run

    script = _script()
    events = []

    class Server:
        url = "http://127.0.0.1:1"

    def start(specs, setup, log_dir, progress=print):
        events.append("start")
        return {spec.name: Server() for spec in specs}

    def session(workload, s, name, servers, tokenizer, max_tokens):
        events.append((s, name))
        return _session_rows(name, 0, 1.0)

    monkeypatch.setattr(server_run, "find_llama_server", lambda path: None)
    monkeypatch.setattr(server_run, "server_setup", lambda *a: (None, None))
    monkeypatch.setattr(server_bench, "start_servers", start)
    monkeypatch.setattr(server_bench, "stop_servers", lambda servers: events.append("stop"))
    monkeypatch.setattr(script, "warm_up", lambda servers: events.append("warm"))
    monkeypatch.setattr(script, "session", session)
    assert script.main(["--workloads", "chat", "--sessions", "2", "--rounds", "2", "--methods",
                        "llama-server", "redwood", "--out-dir", str(tmp_path)]) == 0
    assert events == ["start", "warm", (0, "llama-server"), (0, "redwood"), (1, "redwood"),
                      (1, "llama-server"), "stop",
                      "start", "warm", (0, "redwood"), (0, "llama-server"), (1, "llama-server"),
                      (1, "redwood"), "stop"]
    doc = json.loads(next(tmp_path.glob("multi-turn-*.json")).read_text())
    assert doc["rounds"] == 2
    assert sorted({row["round"] for row in doc["rows"]}) == [0, 1]
    assert doc["summary"]["chat/0"]["redwood"]["rounds_seconds"] == [1.0, 1.0]


def test_a_longer_conversation_is_compared_at_its_own_length():
    script = _script()

    def rows(method, total, tokens):
        # turn 0: 0.5 s to the first token, then 0.1 s a token; turn 1 likewise
        out = [{"workload": "chat", "session": 0, "method": method, "turn": t, "round": 0,
                "answer": f"{method}{t}", "ttft_seconds": 0.5, "completion_tokens": n,
                "wall_seconds": 0.5 + 0.1 * (n - 1)} for t, n in enumerate(tokens)]
        return out + [{"workload": "chat", "session": 0, "method": method, "turn": "all",
                       "round": 0, "wall_seconds": total}]

    # the baseline decodes 0.1 s a token; redwood answered 20 tokens more in 12 s against 11 s
    data = rows("server", 11.0, (41, 51)) + rows("redwood", 12.0, (51, 61))
    entry = script.summarise(data, ["server", "redwood"])["chat/0"]["redwood"]
    assert entry["speed_vs_base"] == pytest.approx(11 / 12, abs=1e-3)
    assert entry["same_length_speed_vs_base"] == pytest.approx(13 / 12, abs=1e-3)
    assert entry["same_length_worst_round"] == entry["same_length_speed_vs_base"]
    # identical lengths: the same figure as the plain ratio
    same = rows("server", 11.0, (41, 51)) + rows("redwood", 10.0, (41, 51))
    entry = script.summarise(same, ["server", "redwood"])["chat/0"]["redwood"]
    assert entry["same_length_speed_vs_base"] == entry["speed_vs_base"] == 1.1


def test_summarise_rewrites_an_earlier_file_without_timing_anything(tmp_path):
    script = _script()
    rows = _session_rows("server", 0, 10.0) + _session_rows("redwood", 0, 8.0)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"methods": ["server", "redwood"], "rows": rows, "summary": {}}))
    assert script.main(["--summarise", str(path)]) == 0
    summary = json.loads(path.read_text())["summary"]
    assert summary["chat/0"]["redwood"]["speed_vs_base"] == 1.25
