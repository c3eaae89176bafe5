"""`redwood bench`: the --quick pipeline end to end on tiny models, the numbers in its output
recomputed from its raw records, its pieces (runners, grids, vectors, scaling) and bad input."""
from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
import torch

from redwood.bench.config import BenchConfig, quick_config
from redwood.bench.methods import METHODS, parse_specinfer_grid
from redwood.bench.run import bench_settings
from redwood.bench.runners import AssistantSchedule, Setting, hf_generation_config, hf_runner, \
    redwood_runner
from redwood.bench.scaling import best_specinfer, budgets_up_to
from redwood.cli.main import main
from redwood.errors import RedwoodError
from redwood.plan.formats import Acceptance
from redwood.plan.tree import Tree, specinfer

ROW_KEYS = {"method": str, "temperature": float, "top_p": float,
            "speedup_vs_autoregressive": (float, type(None)),
            "speedup_vs_hf_generate": (float, type(None)), "tokens_per_step": float,
            "predicted_tokens_per_step": (float, type(None))}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One `redwood bench --quick` run (tiny pair, all methods, all settings, plots)."""
    out = tmp_path_factory.mktemp("bench")
    torch.set_num_threads(1)
    assert main(["bench", "--quick", "--out-dir", str(out), "--machine", "test"]) == 0
    [summary_path] = [p for p in out.glob("test-*.json") if not p.name.endswith(".raw.json")]
    summary = json.loads(summary_path.read_text())
    raw = json.loads((out / summary["raw"]).read_text())["records"]
    markdown = summary_path.with_suffix(".md").read_text()
    return out, summary, raw, markdown


def test_quick_writes_summary_raw_markdown_and_plots(quick_run):
    out, summary, raw, markdown = quick_run
    assert summary["kind"] == "bench" and summary["format"] == 1
    config = quick_config()
    settings = bench_settings(config)
    rows = summary["summary"]
    assert len(rows) == len(settings) * len(METHODS)
    for row in rows:
        for key, kind in ROW_KEYS.items():
            assert isinstance(row[key], kind), (key, row[key])
    assert {(r["temperature"], r["top_p"]) for r in rows} == \
        {(s.temperature, s.top_p) for s in settings}
    assert {r["method"] for r in rows} == set(METHODS)
    for name in summary["plots"].values():
        assert (out / name).stat().st_size > 1000
    # every record generated the same number of tokens: EOS ignored for every method
    assert {r["new_tokens"] for r in raw} == {config.max_new_tokens}
    assert len(raw) == len(rows) * config.prompts
    # the markdown table has one line per summary row, with its method and numbers
    table = [line for line in markdown.splitlines() if line.startswith("| ")][1:]
    assert len(table) == len(rows)
    for line, row in zip(table, rows):
        assert f"| {row['tokens_per_second']:.2f} |" in line
    assert "Reduced versus the issue's full specification" in markdown
    assert any("--quick" in r for r in summary["reductions"])


def test_ratios_and_pooled_numbers_come_from_the_raw_records(quick_run):
    _, summary, raw, _ = quick_run
    for row in summary["summary"]:
        def records(method):
            return {r["prompt"]: r for r in raw if r["method"] == method
                    and r["temperature"] == row["temperature"] and r["top_p"] == row["top_p"]}
        mine, ar, hf = records(row["method"]), records("autoregressive"), records("hf_generate")
        # the first token is not timed where it comes from the prefill: transformers generate
        # and plain decoding (autoregressive, or a tree of one node) in redwood's engine
        plain = row["method"] in ("autoregressive", "hf_generate") or row["tree_parents"] == [-1]
        tps = {i: r["new_tokens"] - (1 if r["prefill_estimated"] or plain else 0)
               for i, r in mine.items()}
        for i, r in mine.items():
            assert r["timed_tokens"] == tps[i]
            assert r["tokens_per_second"] == pytest.approx(tps[i] / r["decode_seconds"])
        assert row["tokens_per_second"] == pytest.approx(
            statistics.median(r["tokens_per_second"] for r in mine.values()))
        assert row["speedup_vs_autoregressive"] == pytest.approx(statistics.median(
            mine[i]["tokens_per_second"] / ar[i]["tokens_per_second"] for i in mine))
        assert row["speedup_vs_hf_generate"] == pytest.approx(statistics.median(
            mine[i]["tokens_per_second"] / hf[i]["tokens_per_second"] for i in mine))
        assert row["tokens_per_step"] == pytest.approx(
            sum(r["new_tokens"] for r in mine.values())
            / sum(r["target_forwards"] for r in mine.values()))
        split = row["time_split"]
        assert sum(split.values()) == pytest.approx(1.0, abs=1e-6)


def test_predictions_use_the_reported_vector_and_tree(quick_run):
    _, summary, _, _ = quick_run
    vectors = {(v["temperature"], v["method"]): v["p"] for v in summary["vectors"]}
    for row in summary["summary"]:
        if row["method"] in ("sequoia", "chain"):
            p = vectors[(row["temperature"], "sequoia")]
            expected = Tree(row["tree_parents"]).expected_length(p)
            assert row["predicted_tokens_per_step"] == pytest.approx(expected)
        if row["method"] in ("autoregressive", "hf_generate"):
            assert row["predicted_tokens_per_step"] == 1.0
            assert row["tokens_per_step"] == pytest.approx(1.0)


def test_greedy_redwood_methods_reproduce_autoregressive(quick_run):
    _, summary, _, _ = quick_run
    for row in summary["summary"]:
        if row["temperature"] == 0 and row["method"] in ("chain", "specinfer", "sequoia",
                                                          "sequoia_adaptive", "hf_generate"):
            assert row["greedy_matches_autoregressive"] is True, row["method"]
        if row["temperature"] > 0:
            assert row["greedy_matches_autoregressive"] is None


def test_grid_choices_are_recorded_with_their_candidates(quick_run):
    _, summary, _, _ = quick_run
    chosen = {(s["method"], s["temperature"], s["top_p"]): s for s in summary["selections"]}
    for row in summary["summary"]:
        if row["method"] in ("specinfer", "hf_assisted_constant"):
            selection = chosen[(row["method"], row["temperature"], row["top_p"])]
            assert selection["chosen"] == row["config"]
            rates = {c["config"]: c["tokens_per_second"] for c in selection["candidates"]}
            assert rates[row["config"]] == max(rates.values())


def test_scaling_quick(tmp_path):
    torch.set_num_threads(1)
    args = ["bench", "--quick", "--scaling", "--max-budget", "4", "--prompts", "1",
            "--max-new-tokens", "8", "--temperatures", "0", "1.0", "--out-dir", str(tmp_path),
            "--machine", "t", "--no-plots"]
    assert main(args) == 0
    [path] = tmp_path.glob("t-*-scaling.json")
    rows = json.loads(path.read_text())["rows"]
    assert {(r["temperature"], r["budget"]) for r in rows} == {(t, n) for t in (0.0, 1.0)
                                                               for n in (1, 2, 4)}
    for r in rows:
        assert r["nodes"] <= r["budget"]
        assert 1.0 <= r["tokens_per_step"] <= r["levels"]
        assert r["measured"] == (r["budget"] > 1)
    assert "| 0 | 4 |" in path.with_suffix(".md").read_text()


@pytest.mark.parametrize("args, message", [
    (["--prompts", "0"], "--prompts must be an integer >= 1"),
    (["--prompts", "500"], "the evaluation split has only"),
    (["--max-new-tokens", "0"], "max_new_tokens must be a positive integer"),
    (["--temperatures", "-1"], "temperature must be a number >= 0"),
    (["--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--methods", "sequoia", "turbo"], "unknown method(s) turbo"),
    (["--specinfer-grid", "2y3"], "is not KxD"),
    (["--hf-constant-grid", "0"], "--hf-constant-grid entries must be an integer >= 1"),
    (["--select-prompts", "99"], "--select-prompts must be an integer in 0..40"),
    (["--acceptance", "/nonexistent/a.json"], "acceptance file not found"),
    (["--model", "qwen2.5-coder"], "--quick uses tiny built-in models"),
])
def test_bad_input_is_one_line_error(args, message, capsys, tmp_path):
    code = main(["bench", "--quick", "--out-dir", str(tmp_path)] + args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())          # nothing written


def test_real_run_without_vectors_fails_before_loading(tmp_path, capsys, monkeypatch):
    import redwood.bench.inputs as inputs

    monkeypatch.setattr(inputs, "load_models", lambda *a, **k: pytest.fail("loaded models"))
    monkeypatch.setenv("REDWOOD_BUNDLE", str(tmp_path / "missing"))
    code = main(["bench", "--target", str(tmp_path), "--draft", str(tmp_path),
                 "--out-dir", str(tmp_path)])
    assert code == 2 and "no acceptance vectors" in capsys.readouterr().err


def test_reductions_name_what_is_missing():
    assert BenchConfig().reductions() == []
    reduced = BenchConfig(prompts=3, max_new_tokens=64, temperatures=(0.0, 0.6), top_ps=(1.0,),
                          hf_constant_grid=(4,), specinfer_grid=((2, 2),))
    text = " | ".join(reduced.reductions())
    for part in ("3 prompts instead of 20", "64 new tokens instead of 128",
                 "temperatures 1.0 not run", "top_ps 0.9 not run", "constant k fixed at 4",
                 "specinfer fixed at 2x2"):
        assert part in text


def test_greedy_runs_once_per_temperature_zero():
    config = BenchConfig(temperatures=(0.0, 0.6), top_ps=(1.0, 0.9))
    assert bench_settings(config) == [Setting(0.0, 1.0), Setting(0.6, 1.0), Setting(0.6, 0.9)]


def test_parse_specinfer_grid():
    assert parse_specinfer_grid("2x2, 3X1") == [(2, 2), (3, 1)]
    assert parse_specinfer_grid([(1, 4)]) == [(1, 4)]
    for bad in ("", "2x", "0x3", "axb"):
        with pytest.raises(RedwoodError):
            parse_specinfer_grid(bad)


def test_budgets_and_best_specinfer_by_brute_force():
    assert budgets_up_to(1) == [1]
    assert budgets_up_to(16) == [1, 2, 4, 8, 16]
    assert budgets_up_to(12) == [1, 2, 4, 8, 12]
    rng = np.random.default_rng(0)
    for _ in range(5):
        p = np.sort(rng.dirichlet(np.ones(6)) * 0.95)[::-1]
        for n in (2, 5, 9):
            best = best_specinfer(p, n)
            assert len(best) <= n
            k_min = 2 if n >= 3 else 1
            brute = max(specinfer(k, d).expected_length(p) for k in range(k_min, n)
                        for d in range(1, n) if k * d <= n - 1)
            assert best.expected_length(p) == pytest.approx(brute)
            assert len(best.children[0]) >= k_min


def test_vector_lookup_prefers_method_then_nearest_setting():
    from redwood.bench.inputs import PlanInputs

    def acc(t, top_p, method="sequoia", p1=0.5):
        return Acceptance(p=[p1, 0.1], temperature=t, top_p=top_p, extra={"method": method})

    inputs = PlanInputs([(acc(0.0, 1.0), "a"), (acc(0.6, 1.0), "b"), (acc(1.0, 1.0), "c"),
                         (acc(0.6, 0.9, p1=0.4), "d"), (acc(0.6, 1.0, "specinfer"), "e")],
                        None, "none")
    assert inputs.vector(0.7, 1.0).source == "b"
    assert "nearest temperature 0.6" in inputs.vector(0.7, 1.0).note
    assert inputs.vector(0.6, 0.9).source == "d" and inputs.vector(0.6, 0.9).note == ""
    assert inputs.vector(1.0, 0.9).source == "c"
    assert "measured at top_p=1.0" in inputs.vector(1.0, 0.9).note
    assert inputs.vector(0.6, 1.0, "specinfer").source == "e"
    nearest = inputs.vector(0.0, 1.0, "specinfer")
    assert nearest.source == "e" and "nearest temperature 0.6" in nearest.note
    only_sequoia = PlanInputs([(acc(0.0, 1.0), "a")], None, "none")
    fallback = only_sequoia.vector(0.0, 1.0, "specinfer")
    assert fallback.source == "a" and "no specinfer vector" in fallback.note
    with pytest.raises(RedwoodError, match="no acceptance vector"):
        PlanInputs([], None, "none").vector(0.0, 1.0)


def test_hf_generation_config_is_clean():
    from redwood.models.tiny_random import tiny_model

    model = tiny_model()
    model.generation_config.top_k = 20                  # a model default that must not leak
    model.generation_config.repetition_penalty = 1.3
    config = hf_generation_config(model, Setting(0.6, 0.9), 7)
    assert (config.do_sample, config.temperature, config.top_p) == (True, 0.6, 0.9)
    assert (config.top_k, config.repetition_penalty) == (0, 1.0)
    assert config.max_new_tokens == 7 and list(config.eos_token_id) == []
    assert hf_generation_config(model, Setting(0.0, 1.0), 3).do_sample is False


def test_runners_count_forwards_and_tokens():
    """transformers greedy (alone or assisted) = redwood autoregressive greedy, and the
    runners' forward counts and token counts are what each method must produce."""
    from redwood.bench.inputs import quick_pair
    from redwood.decode.engine import Engine
    from redwood.prompts import humaneval_prompts
    from redwood.plan.tree import chain

    torch.set_num_threads(1)
    pair = quick_pair()
    target, draft = pair.target, pair.draft
    ids = pair.encode(humaneval_prompts("evaluation", limit=5))[4]
    greedy, m = Setting(0.0, 1.0), 80
    ours = redwood_runner(Engine(target, draft, chain(1)), "autoregressive")(ids, greedy, 0, m)
    assert 1 in ours.tokens[:-1]       # the target's greedy path crosses EOS (id 1) and goes on
    hf = hf_runner(target)(ids, greedy, 0, m)
    assisted = hf_runner(target, draft, AssistantSchedule(3))(ids, greedy, 0, m)
    assert hf.tokens == ours.tokens == assisted.tokens and len(ours.tokens) == m
    assert ours.target_forwards == m and hf.target_forwards == m and hf.timed_tokens == m - 1
    assert ours.timed_tokens == m - 1          # its first token comes from the prefill too
    assert assisted.target_forwards < m and assisted.draft_forwards >= assisted.target_forwards
    assert draft.generation_config.num_assistant_tokens != 3    # schedule restored afterwards
    for m in (ours, hf, assisted):
        assert m.decode_seconds > 0 and m.other_seconds >= 0


def _script(name):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_engine_overhead_script_quick(tmp_path):
    out = tmp_path / "overhead.json"
    report = _script("engine_overhead").main(["--quick", "--prompts", "1", "--max-new-tokens",
                                              "10", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == report["rows"]
    for row in report["rows"]:
        parts = row["target_forward_ms"] + row["draft_forwards_ms"] + row["everything_else_ms"]
        assert parts == pytest.approx(row["step_ms"])
        assert row["steps"] * row["tokens_per_step"] == pytest.approx(row["tokens"])
        assert 0 < row["target_forward_ms"] <= row["engine_split_ms"]["target"] + 1e-9
    sequoia, plain = report["rows"]
    assert sequoia["draft_forwards_ms"] > 0 and plain["draft_forwards_ms"] == 0
    assert "keep_tail" in sequoia["helpers_ms"] and plain["tree_nodes"] == 1


def test_engine_overhead_prefill_ab_quick(tmp_path):
    out = tmp_path / "prefill.json"
    report = _script("engine_overhead").main(["--prefill", "--quick", "--lengths", "8", "40",
                                              "--nodes", "1", "4", "--repeats", "2",
                                              "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == report["rows"]
    assert [(r["prompt_tokens"], r["nodes"]) for r in report["rows"]] == [(8, 1), (8, 4), (40, 1), (40, 4)]
    for row in report["rows"]:
        for route in ("separate", "fused"):
            assert len(row[route]["all_ms"]) == 2 and row[route]["min_ms"] > 0
        assert row["saving_median_ms"] == pytest.approx(row["separate"]["median_ms"]
                                                        - row["fused"]["median_ms"])
        assert row["max_abs_logit_diff"] < 1e-4             # the same logits either way


def test_compare_hf_script_quick(tmp_path, capsys):
    summary = _script("compare_hf").main(["--quick", "--prompts", "1", "--max-new-tokens", "10",
                                          "--out-dir", str(tmp_path), "--no-plots"])
    assert [r["method"] for r in summary["summary"]] == ["autoregressive", "hf_generate", "sequoia"]
    assert all(r["greedy_matches_autoregressive"] for r in summary["summary"])
    printed = capsys.readouterr().out
    assert "sequoia / autoregressive:" in printed and "identical to autoregressive: yes" in printed
    assert (tmp_path / f"{summary['stem']}.md").is_file()
