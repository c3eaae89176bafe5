"""`redwood generate` end to end on tiny random models that share the real Qwen tokenizer."""
import json

import pytest
import torch

from redwood.cli.main import main
from redwood.decode.engine import Engine
from redwood.plan.tree import Tree
from tiny import tiny_model

TREE = Tree([-1, 0, 0, 1, 1, 3])


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, shipped_tokenizer):
    root = tmp_path_factory.mktemp("tiny-pair")
    vocab = len(shipped_tokenizer)
    target = tiny_model("qwen2", vocab_size=vocab, seed=5, max_positions=256)
    draft = tiny_model("qwen2", vocab_size=vocab, seed=6, max_positions=256)
    other = tiny_model("qwen2", vocab_size=vocab - 10, seed=7, max_positions=256)
    for name, model in (("target", target), ("draft", draft), ("other", other)):
        model.save_pretrained(root / name)
    shipped_tokenizer.save_pretrained(root / "target")
    TREE.save(root / "tree.json")
    return root, target, draft


def _args(root, *extra):
    return ["generate", "--target", str(root / "target"), "--draft", str(root / "draft"),
            "--tree", str(root / "tree.json"), *extra]


def test_json_output_matches_the_engine(model_dirs, shipped_tokenizer, capsys):
    root, target, draft = model_dirs
    assert main(_args(root, "def add(a, b):", "--max-new-tokens", "12", "--ignore-eos",
                      "--json")) == 0
    record = json.loads(capsys.readouterr().out)
    ids = torch.tensor(shipped_tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"])
    expected = Engine(target, draft, TREE).generate(ids, 12, stop_on_eos=False)
    assert record["tokens"] == expected.tokens
    assert record["text"] == shipped_tokenizer.decode(expected.tokens, skip_special_tokens=True)
    assert sum(record["accepted"]) == 12 and record["method"] == "sequoia"


def test_draft_confidence_prunes_and_keeps_the_output(model_dirs, capsys):
    root, _, _ = model_dirs
    runs = {}
    for confidence in ("0", "0.9"):
        assert main(_args(root, "def add(a, b):", "--max-new-tokens", "12", "--ignore-eos",
                          "--json", "--draft-confidence", confidence)) == 0
        runs[confidence] = json.loads(capsys.readouterr().out)
    assert runs["0.9"]["tokens"] == runs["0"]["tokens"]
    assert runs["0.9"]["draft_tokens_per_step"] < runs["0"]["draft_tokens_per_step"] == len(TREE) - 1


def test_streams_text_and_prints_stats(model_dirs, capsys):
    root, _, _ = model_dirs
    assert main(_args(root, "hello", "--max-new-tokens", "6", "--temperature", "0.7",
                      "--seed", "3", "--chat", "--method", "specinfer")) == 0
    captured = capsys.readouterr()
    assert captured.out.strip()
    assert "tokens per target forward" in captured.err and "tokens/s" in captured.err


@pytest.mark.parametrize("extra, message", [
    (["   "], "prompt is empty"),
    (["x", "--temperature", "-1"], "temperature"),
    (["x", "--top-p", "0"], "top_p"),
    (["x", "--top-k", "-2"], "top_k"),
    (["x", "--max-new-tokens", "0"], "max_new_tokens"),
    (["x", "--max-new-tokens", "1000"], "context"),
    (["x", "--draft-confidence", "1"], "draft_confidence"),
    (["x", "--draft-confidence", "-0.5"], "draft_confidence"),
])
def test_bad_input_is_one_line_and_exit_2(model_dirs, capsys, extra, message):
    root, _, _ = model_dirs
    assert main(_args(root, *extra)) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err


def test_bad_files_are_reported(model_dirs, tmp_path, capsys):
    root, _, _ = model_dirs
    (tmp_path / "bad.json").write_text('{"format": 1, "kind": "tree", "parents": [-1, 0, 5]}')
    assert main(["generate", "x", "--target", str(root / "target"), "--draft",
                 str(root / "draft"), "--tree", str(tmp_path / "bad.json")]) == 2
    assert main(["generate", "x", "--target", str(root / "target"), "--draft",
                 str(root / "other")]) == 2
    assert main(["generate", "x", "--target", str(tmp_path / "missing"), "--draft",
                 str(root / "draft")]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 3 and "Traceback" not in err
    assert "bad.json" in errors[0]
    assert "vocabularies differ" in errors[1]
    assert "missing" in errors[2]


def test_stream_text_applies_stop_strings(model_dirs, shipped_tokenizer):
    """The engine knows only tokens; stream_text cuts the text at SamplingParams.stop."""
    from redwood.cli.textgen import stream_text
    from redwood.decode.params import SamplingParams

    _, target, draft = model_dirs
    engine = Engine(target, draft, TREE)
    params = SamplingParams(max_new_tokens=16)
    _, full = stream_text(engine, shipped_tokenizer, "def add(a, b):", params, stop_on_eos=False)
    stop = full[len(full) // 2: len(full) // 2 + 2]
    pieces = []
    result, text = stream_text(engine, shipped_tokenizer, "def add(a, b):",
                               params.with_(stop=("\u2603 never", stop)), stop_on_eos=False,
                               on_text=pieces.append)
    assert text == "".join(pieces) == full[:full.find(stop)]
    assert result is not None and len(result.tokens) <= 16


@pytest.mark.parametrize("drafter", ["ngram", "hybrid"])
def test_free_and_hybrid_drafters_keep_greedy_output(model_dirs, shipped_tokenizer, capsys,
                                                     tmp_path, monkeypatch, drafter):
    """`--drafter ngram|hybrid` measure this machine once (a first-use profile in
    REDWOOD_CACHE), then decode exactly what the target alone decodes greedily."""
    root, target, draft = model_dirs
    monkeypatch.setenv("REDWOOD_CACHE", str(tmp_path / "cache"))
    prompt = "x = [1, 2, 3]\nx = [1, 2, 3]\nx = [1, 2"
    assert main(_args(root, prompt, "--max-new-tokens", "16", "--ignore-eos", "--json",
                      "--drafter", drafter)) == 0
    record = json.loads(capsys.readouterr().out)
    ids = torch.tensor(shipped_tokenizer(prompt, add_special_tokens=False)["input_ids"])
    expected = Engine(target, draft, TREE).generate(ids, 16, method="autoregressive",
                                                    stop_on_eos=False)
    assert record["tokens"] == expected.tokens
    assert sum(record["accepted"]) == 16
    assert set(record["accepted_by_source"]) <= ({"ngram", "model"} if drafter == "hybrid"
                                                 else {"ngram"})
    assert any((tmp_path / "cache").rglob("*.json")), "no machine profile was cached"
    live = record["governor"]                      # the governor's live figures, every step
    assert live["speculative_steps"] + live["plain_steps"] <= len(record["accepted"])
    assert live["live_tokens_per_ms"] >= 0 and live["plain_tokens_per_ms"] > 0


def test_kernels_are_chosen_per_machine_unless_stock(model_dirs, capsys, tmp_path, monkeypatch):
    """Default --kernels auto times F.linear against oneDNN once (cached under
    REDWOOD_CACHE/profiles/kernels) and keeps the output; --kernels stock measures nothing."""
    root, _, _ = model_dirs
    outputs = {}
    for kernels in ("stock", "auto"):
        cache = tmp_path / kernels
        monkeypatch.setenv("REDWOOD_CACHE", str(cache))
        assert main(_args(root, "def add(a, b):", "--max-new-tokens", "8", "--ignore-eos",
                          "--json", "--kernels", kernels)) == 0
        outputs[kernels] = json.loads(capsys.readouterr().out)["tokens"]
        choices = list(cache.rglob("kernels/*.json"))
        # one choice per distinct set of Linear shapes (the tiny target and draft share one)
        assert bool(choices) == (kernels == "auto"), choices
    assert outputs["auto"] == outputs["stock"]


def test_grown_trees_keep_greedy_output(model_dirs, shipped_tokenizer, capsys, tmp_path,
                                        monkeypatch):
    """`--grow`: each step's tree grown inside --tree on this machine's first-use profile."""
    root, target, draft = model_dirs
    monkeypatch.setenv("REDWOOD_CACHE", str(tmp_path / "cache"))
    assert main(_args(root, "def add(a, b):", "--max-new-tokens", "12", "--ignore-eos", "--json",
                      "--grow")) == 0
    record = json.loads(capsys.readouterr().out)
    ids = torch.tensor(shipped_tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"])
    expected = Engine(target, draft, TREE).generate(ids, 12, method="autoregressive",
                                                    stop_on_eos=False)
    assert record["tokens"] == expected.tokens
    assert record["draft_tokens_per_step"] <= len(TREE) - 1
    assert main(_args(root, "x", "--grow", "--drafter", "ngram")) == 2
    assert "--grow applies to the draft-model drafter" in capsys.readouterr().err


def test_grow_flag_has_three_states():
    """No flag: the measured default (grows_by_default); --grow / --no-grow force it."""
    from redwood.cli.main import build_parser
    from redwood.cli.options import _model_config

    parser = build_parser()
    for flags, grow in (([], None), (["--grow"], True), (["--no-grow"], False)):
        for verb in ("generate", "serve"):
            args = parser.parse_args([verb, *(["x"] if verb == "generate" else []), *flags])
            assert _model_config(args).grow is grow, (verb, flags)


def test_stats_line_says_where_a_fused_prompt_pass_is_counted():
    """A fused first verification puts the target's prompt pass inside the decode time; the
    summary must not call the (draft-only) prefill figure the prefill."""
    from redwood.cli.textgen import stats_lines
    from redwood.decode.stats import GenerationResult, StepStats

    fused = GenerationResult([1, 2], [1, 1], StepStats(fused_prefill=True), 0.05, "sequoia")
    plain = GenerationResult([1, 2], [1, 1], StepStats(), 0.5, "autoregressive")
    assert "prompt pass included" in stats_lines(fused)[0]
    assert "draft's prefill 0.05 s excluded" in stats_lines(fused)[0]
    assert stats_lines(plain)[0].endswith("prefill 0.50 s excluded)")
