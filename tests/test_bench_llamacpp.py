"""`redwood bench --backend llamacpp` end to end on tiny GGUF models: every method's row (the
llama-cpp-python baselines among them), end-to-end times, ratios to plain llama.cpp recomputed
from the raw records, greedy outputs equal across methods, and bad input."""
from __future__ import annotations

import json
import statistics

import pytest

pytest.importorskip("llama_cpp")

from redwood.bench.methods import LLAMACPP_METHODS  # noqa: E402
from redwood.cli.main import main  # noqa: E402
from redwood.plan.formats import sample_profile_path  # noqa: E402
from tiny_gguf import tiny_gguf_pair  # noqa: E402,F401

try:                                # a draft that agrees with the target often, not always
    from tiny_gguf import write_perturbed_gguf
except ImportError:                 # pragma: no cover - older helper: the unrelated draft
    write_perturbed_gguf = None

REDWOOD = ("autoregressive", "chain", "specinfer", "sequoia", "sequoia_fixed")
PROMPTS, TOKENS = 2, 8


def _data(name: str) -> str:
    from importlib import resources

    return str(resources.files("redwood") / "data" / name)


@pytest.fixture(scope="module")
def llamacpp_run(tiny_gguf_pair, tmp_path_factory):
    """One llama.cpp bench: 2 prompts x 8 tokens at T = 0 and 0.6, every default method."""
    target, draft = tiny_gguf_pair
    if write_perturbed_gguf is not None:
        draft = write_perturbed_gguf(tmp_path_factory.mktemp("draft") / "draft.gguf", 0, 0.1)
    out = tmp_path_factory.mktemp("bench_llamacpp")
    assert main(["bench", "--backend", "llamacpp", "--target", str(target), "--draft", str(draft),
                 "--prompts", str(PROMPTS), "--max-new-tokens", str(TOKENS),
                 "--temperatures", "0", "0.6", "--top-p", "1.0",
                 "--acceptance", _data("sample_acceptance.json"),
                 "--profile", str(sample_profile_path()), "--specinfer-grid", "2x2",
                 "--select-prompts", "0", "--out-dir", str(out), "--machine", "test"]) == 0
    [path] = [p for p in out.glob("test-llamacpp-*.json") if not p.name.endswith(".raw.json")]
    summary = json.loads(path.read_text())
    raw = json.loads((out / summary["raw"]).read_text())["records"]
    return summary, raw, path.with_suffix(".md").read_text()


def test_every_method_has_a_row_with_end_to_end_times(llamacpp_run):
    summary, raw, markdown = llamacpp_run
    assert summary["backend"] == "llamacpp"
    assert "llama-cpp-python 0.3" in summary["runtime"] and "threads" in summary["runtime"]
    rows = summary["summary"]
    assert len(rows) == 2 * len(LLAMACPP_METHODS)
    for t in (0.0, 0.6):
        assert {r["method"] for r in rows if r["temperature"] == t} == set(LLAMACPP_METHODS)
    assert len(raw) == len(rows) * PROMPTS
    for r in raw:
        assert r["new_tokens"] == TOKENS                       # EOS ignored everywhere
        assert r["end_to_end_seconds"] > 0 and r["decode_seconds"] > 0
        assert r["end_to_end_seconds"] >= r["prefill_seconds"]
        assert r["target_forwards"] >= 1
    for row in rows:
        assert row["end_to_end_seconds"] > 0 and 0 <= row["overhead_share"] <= 1
        assert row["speedup_vs_plain_llamacpp"] > 0
        assert row["speedup_vs_plain_llamacpp_min"] <= row["speedup_vs_plain_llamacpp"]
        if row["method"] in ("llamacpp_plain", "autoregressive"):
            assert row["tokens_per_step"] == pytest.approx(1.0)
        if row["method"] == "llamacpp_plain":
            assert row["speedup_vs_plain_llamacpp"] == pytest.approx(1.0)
    # the markdown: the runtime in the header, one table line per row
    assert summary["runtime"] in markdown
    table = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert "end-to-end s" in table[0] and len(table) == 1 + len(rows)
    for name in summary["plots"].values():
        assert name.startswith(summary["stem"])


def test_ratios_to_plain_come_from_the_raw_records(llamacpp_run):
    summary, raw, _ = llamacpp_run
    for row in summary["summary"]:
        def records(method):
            return {r["prompt"]: r for r in raw if r["method"] == method
                    and r["temperature"] == row["temperature"] and r["top_p"] == row["top_p"]}
        mine, plain = records(row["method"]), records("llamacpp_plain")
        ratios = [plain[i]["end_to_end_seconds"] / r["end_to_end_seconds"] for i, r in mine.items()]
        assert row["speedup_vs_plain_llamacpp"] == pytest.approx(statistics.median(ratios))
        assert row["speedup_vs_plain_llamacpp_min"] == pytest.approx(min(ratios))
        assert row["end_to_end_seconds"] == pytest.approx(
            statistics.median(r["end_to_end_seconds"] for r in mine.values()))


def test_greedy_methods_reproduce_plain_decoding(llamacpp_run):
    summary, raw, _ = llamacpp_run
    greedy = [r for r in raw if r["temperature"] == 0]
    for r in greedy:
        if r["method"] in REDWOOD:
            assert r["greedy_matches_autoregressive"] is True, r["method"]
        assert isinstance(r["greedy_matches_plain_llamacpp"], bool)
    speculative = [r for r in greedy if r["method"] in ("sequoia_fixed", "specinfer")]
    assert any(r["new_tokens"] > r["target_forwards"] for r in speculative) or \
        write_perturbed_gguf is None           # the perturbed draft gets tokens accepted
    for row in summary["summary"]:
        if row["temperature"] > 0:
            assert row["greedy_matches_autoregressive"] is None


@pytest.mark.parametrize("args, message", [
    (["--quick", "--backend", "llamacpp"], "--quick runs the tiny transformers pair"),
    (["--backend", "llamacpp", "--methods", "sequoia", "hf_generate"],
     "unknown method(s) hf_generate for the llamacpp backend"),
    (["--backend", "hf", "--methods", "llamacpp_plain"],
     "run on the llama.cpp backend: --backend llamacpp"),
])
def test_bad_backend_input_is_one_line_error(args, message, capsys, tmp_path):
    code = main(["bench", "--out-dir", str(tmp_path)] + args)
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())
