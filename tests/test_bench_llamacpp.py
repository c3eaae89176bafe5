"""`redwood bench --backend llamacpp` end to end on tiny GGUF models: every method's row (the
llama-cpp-python baselines among them, and the governed defaults `ngram` and
`sequoia_governed`), end-to-end times, ratios to plain llama.cpp recomputed from the raw
records, greedy outputs equal across methods, the edit-task prompt sets (the tiny tokenizer has
no chat template: they are encoded as raw text, and the notes say so), and bad input.

The machine profile the governed methods use is seeded with the shipped sample profile in a
temporary REDWOOD_CACHE: measuring the tiny pair would take long on a busy machine, and its
flat t(n) would say nothing about the cost model."""
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

REDWOOD = ("autoregressive", "chain", "specinfer", "sequoia", "sequoia_fixed", "sequoia_governed",
           "ngram", "hybrid")
PROMPTS, TOKENS = 2, 8
EDIT_METHODS = ("llamacpp_plain", "autoregressive", "ngram", "hybrid", "sequoia_governed",
                "llamacpp_prompt_lookup", "llamacpp_prompt_lookup_best")


def _data(name: str) -> str:
    from importlib import resources

    return str(resources.files("redwood") / "data" / name)


@pytest.fixture(scope="module")
def pair_with_profile(tiny_gguf_pair, tmp_path_factory):
    """(target, draft) paths, with REDWOOD_CACHE pointing at a cache that holds this
    machine's profile for them (the sample profile, see the module doc)."""
    from redwood.backends.llamacpp import LlamaCppBackend
    from redwood.measure.machine_profile import machine_profile
    from redwood.plan.formats import Profile

    target, draft = tiny_gguf_pair
    if write_perturbed_gguf is not None:
        draft = write_perturbed_gguf(tmp_path_factory.mktemp("draft") / "draft.gguf", 0, 0.1)
    cache = tmp_path_factory.mktemp("redwood_cache")
    backends = [LlamaCppBackend(path) for path in (target, draft)]
    try:
        machine_profile(*backends, cache_dir=cache / "redwood", progress=False,
                        measure=lambda *args: Profile.load(sample_profile_path()))
    finally:
        for backend in backends:
            backend.close()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REDWOOD_CACHE", str(cache / "redwood"))
        yield target, draft


def _bench(pair, out, *args):
    target, draft = pair
    assert main(["bench", "--backend", "llamacpp", "--target", str(target), "--draft", str(draft),
                 "--max-new-tokens", str(TOKENS), "--top-p", "1.0",
                 "--acceptance", _data("sample_acceptance.json"),
                 "--profile", str(sample_profile_path()), "--specinfer-grid", "2x2",
                 "--select-prompts", "0", "--out-dir", str(out), "--machine", "test",
                 *args]) == 0
    [path] = [p for p in out.glob("test-llamacpp-*.json") if not p.name.endswith(".raw.json")]
    summary = json.loads(path.read_text())
    raw = json.loads((out / summary["raw"]).read_text())["records"]
    return summary, raw, path.with_suffix(".md").read_text()


@pytest.fixture(scope="module")
def llamacpp_run(pair_with_profile, tmp_path_factory):
    """One llama.cpp bench: 2 HumanEval prompts x 8 tokens at T = 0 and 0.6, every default
    method."""
    return _bench(pair_with_profile, tmp_path_factory.mktemp("bench_llamacpp"),
                  "--prompts", str(PROMPTS), "--temperatures", "0", "0.6", "--no-plots")


@pytest.fixture(scope="module")
def edit_run(pair_with_profile, tmp_path_factory):
    """Two edit-task sets and HumanEval, one prompt each, greedy, the methods a user gets
    against llama-cpp-python's; with the plots (one bar group per set and setting)."""
    return _bench(pair_with_profile, tmp_path_factory.mktemp("bench_edit"), "--prompts", "1",
                  "--temperatures", "0", "--prompt-set", "mixed", "low_copy", "humaneval",
                  "--lookup-grid", "2", "10", "--methods", *EDIT_METHODS)


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
    (["--backend", "llamacpp", "--prompt-set", "whole_file", "edits"],
     "unknown prompt set(s) edits; choose from humaneval, whole_file, mixed, low_copy"),
    (["--backend", "llamacpp", "--prompt-set", "mixed", "mixed"], "prompt set(s) given twice: mixed"),
    (["--backend", "llamacpp", "--lookup-grid", "0"], "--lookup-grid entries must be an integer"),
])
def test_bad_backend_input_is_one_line_error(args, message, capsys, tmp_path):
    code = main(["bench", "--out-dir", str(tmp_path)] + args)
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_edit_sets_one_table_each_with_the_new_methods(edit_run):
    summary, raw, markdown = edit_run
    sets = ("mixed", "low_copy", "humaneval")
    assert list(summary["prompt_sets"]) == list(sets)
    rows = summary["summary"]
    assert [(r["prompt_set"], r["method"]) for r in rows] == \
        [(s, m) for s in sets for m in EDIT_METHODS]
    # the tiny tokenizer has no chat template: edit requests fall back to raw text, said so
    assert summary["prompt_sets"]["mixed"]["encoding"] == "raw"
    assert any("no chat template" in n and "mixed" in n for n in summary["notes"])
    assert len(raw) == len(rows)
    for r in raw:
        assert r["prompt_set"] in sets and r["prompt_name"].startswith(r["prompt_set"])
        assert r["new_tokens"] == TOKENS
    edit = [r for r in raw if r["prompt_set"] == "mixed"]
    assert min(r["prompt_tokens"] for r in edit) > 300          # the pasted function is there
    # one table (header line + a line per row) per set, under its own heading
    for name in sets:
        assert f"### {name} (1 prompt, " in markdown
    table = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert len(table) == len(sets) + len(rows) and "by source" in table[0]
    # llama-cpp-python's best prompt lookup: chosen per set on its first prompt
    chosen = [s for s in summary["selections"] if s["method"] == "llamacpp_prompt_lookup_best"]
    assert sorted(s["prompt_set"] for s in chosen) == sorted(sets)
    for s in chosen:
        assert [c["config"] for c in s["candidates"]] == ["lookup k=2", "lookup k=10"]
        assert s["chosen"] in ("lookup k=2", "lookup k=10")
    assert any("FIRST prompt of each prompt set" in n for n in summary["notes"])
    assert summary["plots"] and all(name.startswith(summary["stem"])
                                    for name in summary["plots"].values())


def test_new_methods_greedy_equal_and_tokens_by_source(llamacpp_run, edit_run):
    for summary, raw, _ in (llamacpp_run, edit_run):
        for r in raw:
            if r["temperature"] == 0 and r["method"] in ("ngram", "hybrid", "sequoia_governed"):
                assert r["greedy_matches_autoregressive"] is True, (r["method"], r["prompt"])
            if r["method"] == "ngram":
                assert r["draft_source"] == "ngram" and r["draft_forwards"] == 0
                assert r["governor_plain_steps"] is not None
            if r["method"] in ("llamacpp_plain", "autoregressive"):
                assert r["draft_source"] is None and r["draft_tokens_kept"] == 0
        for row in summary["summary"]:
            split = row["tokens_per_step_by_source"]
            assert sum(split.values()) == pytest.approx(row["tokens_per_step"])
            if row["method"] == "hybrid":
                assert set(split) <= {"target", "ngram", "model"}
            if row["method"] == "ngram":
                assert set(split) <= {"target", "ngram"}
                assert row["governor_plain_share"] is not None
            if row["method"] in ("chain", "specinfer", "sequoia_fixed"):
                assert set(split) <= {"target", "model"}
