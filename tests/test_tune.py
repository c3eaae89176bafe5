"""`redwood tune` end to end on tiny models, bundles, and `--tree auto`."""
import json

import pytest

from redwood.cli.main import main
from redwood.errors import RedwoodError
from redwood.plan.formats import Acceptance, Profile
from redwood.plan.planner import choose_tree
from redwood.measure.bundles import (BUNDLE_ENV, default_tree, find_bundle, load_bundle, resolve_tree,
                             shipped_bundle_dir)
from redwood.models.tiny_random import random_prompts, tiny_pair
from redwood.plan.tree import Tree, chain, specinfer, star
from redwood.measure.tune import TuneSettings, tune

SMALL = TuneSettings(temperatures=(0.0, 1.0), width=4, max_budget=8, max_depth=5, context=16,
                     repeats=1, warmup=0, max_new_tokens=12)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab_size=64, num_layers=3, hidden_size=32)


def test_tune_writes_a_consistent_bundle(tmp_path, pair):
    target, draft = pair
    weaker = tiny_pair(vocab_size=64, num_layers=3, hidden_size=32, seed=9)[1]   # unrelated draft
    out = tmp_path / "bundle"
    result = tune(target, draft, out, random_prompts(4, 64), SMALL,
                  other_drafts={"unrelated": weaker}, labels={"target": "T", "draft": "D"},
                  dataset="random", command="redwood tune --test", progress=False)
    assert result.chosen is max(result.variants, key=lambda v: v.mean_speedup)
    bundle = load_bundle(out)
    index = json.loads((out / "bundle.json").read_text())
    assert index["name"] == "bundle" and index["command"] == "redwood tune --test"
    assert index["fast_linear"] is False and bundle.fast_linear is False
    assert [e.temperature for e in bundle.entries] == [0.0, 1.0]
    profile = Profile.load(out / "profile.json")
    assert sorted(profile.target_ms) == list(range(1, 9))
    for entry in bundle.entries:
        acceptance = Acceptance.load(out / entry.acceptance)
        assert acceptance.temperature == entry.temperature and len(acceptance.p) == 4
        tree = Tree.load(out / entry.tree)
        # the stored tree is the planner's choice from the stored measurements
        assert tree == choose_tree(acceptance, profile, 8, 5).tree
        # the default drafter recorded for `--drafter auto`: free drafts only without a model tree
        assert entry.drafter == ("ngram" if len(tree) == 1 else "hybrid")
        assert (len(tree), tree.num_levels) == (entry.budget, entry.depth)
        assert tree.expected_length(acceptance.p) == pytest.approx(entry.tokens_per_step)
        assert tree.source["tool"] == "redwood tune" and tree.source["temperature"] == entry.temperature
        assert (out / entry.tree.replace(".json", ".png")).is_file()
    other = [v for v in result.variants if v is not result.chosen][0]
    alt = index["alternatives"][0]
    assert alt["directory"] == f"alternatives/{other.name}"
    assert alt["mean_predicted_speedup"] == pytest.approx(other.mean_speedup)
    assert all((out / t["tree"]).is_file() for t in alt["trees"])
    summary = (out / "summary.md").read_text()
    for entry in bundle.entries:
        assert f"| {entry.temperature:g} | {entry.budget} | {entry.depth} |" in summary
    assert "redwood tune --test" in summary and "Draft variants compared" in summary
    assert (out / "profile.png").is_file() and (out / "acceptance.png").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]     # no temp left
    _assert_adaptive_entries_replan(out, bundle, profile, 8, 5)
    assert "## Adaptive trees" in summary


def _assert_adaptive_entries_replan(directory, bundle, profile, max_budget, max_depth):
    """Every entry's adaptive tree and threshold are plan_adaptive's on the stored files."""
    from redwood.plan.adaptive import plan_adaptive

    for entry, record in zip(bundle.entries, bundle.index["trees"]):
        acceptance = Acceptance.load(directory / entry.acceptance)
        static = choose_tree(acceptance, profile, max_budget, max_depth)
        given = record["adaptive"]["threshold_from"] == "given"
        plan = plan_adaptive(acceptance.p, profile, static, max_budget, max_depth,
                             entry.draft_confidence if given else None)
        tree, threshold = bundle.drafting(entry.temperature)
        assert tree == plan.tree and threshold == pytest.approx(plan.draft_confidence)
        assert 0 < threshold < 1


def test_cli_quick_tune_makes_a_loadable_bundle_and_replaces_it(tmp_path, capsys):
    out = tmp_path / "b"
    argv = ["tune", "--quick", "--out", str(out), "--temperatures", "0,0.6", "--max-budget", "6",
            "--repeats", "1", "--warmup", "0", "--num-prompts", "2", "--max-new-tokens", "8"]
    assert main(argv) == 0
    first = json.loads((out / "bundle.json").read_text())
    assert "--quick" in first["command"] and first["settings"]["max_budget"] == 6
    assert [t["temperature"] for t in first["trees"]] == [0.0, 0.6]
    assert isinstance(resolve_tree(str(out), 0.5), Tree)
    assert main(argv + ["--seed", "3"]) == 0                   # an old bundle is replaced
    assert json.loads((out / "bundle.json").read_text())["settings"]["seed"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    assert "predicted speedup" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--temperatures", "0,hot"], "--temperatures"),
    (["--temperatures", "0,0"], "repeat"),
    (["--out", "{tmp}/notabundle"], "not a bundle"),
    (["--compare-int8-draft", "--draft-quantize", "int8"], "drop --draft-quantize"),
    (["--prompts", "{tmp}/missing.jsonl"], "does not exist"),
    (["--max-budget", "0"], "max-budget"),
])
def test_cli_tune_bad_input_exits_2(tmp_path, capsys, argv, message):
    (tmp_path / "notabundle").mkdir()
    (tmp_path / "notabundle" / "keep.txt").write_text("mine")
    argv = [a.format(tmp=tmp_path) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "b")]
    rc = main(["tune", "--quick", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err
    assert (tmp_path / "notabundle" / "keep.txt").read_text() == "mine"


# --- bundles and --tree auto -------------------------------------------------------------

def _hand_bundle(directory, trees, draft_quantize="int8", fast_linear=False):
    """A minimal bundle: {temperature: tree}."""
    directory.mkdir()
    entries = []
    for t, tree in trees.items():
        tree.save(directory / f"tree-{t:g}.json")
        entries.append({"temperature": t, "top_p": 1.0, "tree": f"tree-{t:g}.json",
                        "acceptance": f"acceptance-{t:g}.json", "budget": len(tree),
                        "depth": tree.num_levels, "tokens_per_step": 1.0,
                        "predicted_speedup": 1.0})
    (directory / "bundle.json").write_text(json.dumps(
        {"format": 1, "kind": "bundle", "draft_quantize": draft_quantize, "trees": entries,
         "fast_linear": fast_linear}))
    return directory


@pytest.fixture
def bundle(tmp_path):
    return _hand_bundle(tmp_path / "hand", {0.0: chain(3), 0.6: star(2), 1.0: specinfer(2, 2)})


@pytest.mark.parametrize("temperature, expected", [
    (0.0, chain(3)), (0.2, chain(3)), (0.3, chain(3)),      # 0.3: a tie goes to the lower one
    (0.31, star(2)), (0.7, star(2)), (0.81, specinfer(2, 2)), (5.0, specinfer(2, 2)),
])
def test_bundle_picks_the_nearest_temperature(bundle, temperature, expected):
    assert resolve_tree(str(bundle), temperature) == expected


def test_auto_uses_the_bundle_in_the_environment(bundle, monkeypatch):
    monkeypatch.setenv(BUNDLE_ENV, str(bundle))
    assert resolve_tree("auto", 0.9) == specinfer(2, 2)
    assert resolve_tree("auto", 0.9, pair=None) == specinfer(2, 2)
    assert find_bundle("auto").draft_quantize == "int8"


def test_missing_bundles_say_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.delenv(BUNDLE_ENV, raising=False)
    with pytest.raises(RedwoodError, match="redwood tune --model nopair"):
        resolve_tree("auto", 0.0, pair="nopair")
    with pytest.raises(RedwoodError, match="redwood tune --target"):
        resolve_tree("auto", 0.0, pair=None)
    monkeypatch.setenv(BUNDLE_ENV, str(tmp_path))
    with pytest.raises(RedwoodError, match=f"{BUNDLE_ENV}=.*redwood tune"):
        resolve_tree("auto", 0.0)
    with pytest.raises(RedwoodError, match="not a tuned bundle"):
        resolve_tree(str(tmp_path), 0.0)
    with pytest.raises(RedwoodError, match="does not exist"):
        resolve_tree(str(tmp_path / "nothing.json"), 0.0)


def test_broken_bundle_index_is_reported(bundle):
    data = json.loads((bundle / "bundle.json").read_text())
    (bundle / "tree-0.6.json").unlink()
    with pytest.raises(RedwoodError, match="tree-0.6.json, which is missing"):
        load_bundle(bundle)
    data["trees"] = []
    (bundle / "bundle.json").write_text(json.dumps(data))
    with pytest.raises(RedwoodError, match="non-empty list"):
        load_bundle(bundle)


def test_bundle_drafting_switches_between_adaptive_and_static_trees(bundle):
    data = json.loads((bundle / "bundle.json").read_text())
    chain(8).save(bundle / "adaptive-0.json")
    data["trees"][0]["adaptive"] = {"tree": "adaptive-0.json", "draft_confidence": 0.4}
    (bundle / "bundle.json").write_text(json.dumps(data))
    loaded = load_bundle(bundle)
    assert loaded.drafting(0.0) == (chain(8), 0.4)             # the tuned adaptive setting
    assert loaded.drafting(0.0, 0.25) == (chain(8), 0.25)      # a threshold of the user's
    assert loaded.drafting(0.0, 0) == (chain(3), 0.0)          # 0: the static tree, unpruned
    assert loaded.drafting(0.6) == (star(2), 0.0)              # entries without adaptive trees
    assert loaded.drafting(0.6, 0.3) == (star(2), 0.3)
    data["trees"][0]["adaptive"]["draft_confidence"] = 1.5
    (bundle / "bundle.json").write_text(json.dumps(data))
    with pytest.raises(RedwoodError, match="draft_confidence must be in"):
        load_bundle(bundle)
    data["trees"][0]["adaptive"] = {"tree": "gone.json", "draft_confidence": 0.4}
    (bundle / "bundle.json").write_text(json.dumps(data))
    with pytest.raises(RedwoodError, match="gone.json, which is missing"):
        load_bundle(bundle)
    data["trees"][0]["adaptive"] = {"tree": "adaptive-0.json"}
    (bundle / "bundle.json").write_text(json.dumps(data))
    with pytest.raises(RedwoodError, match="malformed tree entry"):
        load_bundle(bundle)


def test_none_and_tree_files_resolve_as_before(tmp_path):
    assert resolve_tree(None, 1.0) == default_tree()
    path = chain(4).save(tmp_path / "t.json")
    assert resolve_tree(str(path), 1.0) == chain(4)


def test_generate_tree_auto_without_a_bundle_exits_2_before_loading(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(BUNDLE_ENV, raising=False)
    rc = main(["generate", "hello", "--target", str(tmp_path / "t"), "--draft",
               str(tmp_path / "d"), "--tree", "auto"])
    err = capsys.readouterr().err
    assert rc == 2 and "redwood tune" in err and "Traceback" not in err


def test_load_engine_takes_the_bundle_tree_nearest_the_temperature(tmp_path, shipped_tokenizer,
                                                                    monkeypatch):
    from redwood.measure.profile import fast_linear_enabled
    from redwood.cli.textgen import ModelConfig, load_engine
    from redwood.models.tiny_random import tiny_model

    model = tiny_model(vocab_size=64, hidden_size=16, num_layers=1)   # only the tree is checked
    for name in ("target", "draft"):
        model.save_pretrained(tmp_path / name)
    shipped_tokenizer.save_pretrained(tmp_path / "target")
    bundle = _hand_bundle(tmp_path / "hand", {0.0: chain(3), 1.0: specinfer(2, 2)},
                          draft_quantize=None, fast_linear=True)
    monkeypatch.setenv(BUNDLE_ENV, str(bundle))
    config = ModelConfig(target=str(tmp_path / "target"), draft=str(tmp_path / "draft"),
                         tree="auto", bundle_latencies=True)
    engine, _ = load_engine(config, progress=False, temperature=0.9)
    assert engine.tree == specinfer(2, 2) and engine.draft_confidence == 0.0
    assert fast_linear_enabled(engine.target)         # the bundle was profiled so
    config.draft_confidence = 0.3
    engine, _ = load_engine(config, progress=False, temperature=0.9)
    assert engine.tree == specinfer(2, 2) and engine.draft_confidence == 0.3
    config.draft_confidence = 1.0
    with pytest.raises(RedwoodError, match="draft_confidence"):
        load_engine(config, progress=False)


def test_shipped_bundle_is_valid():
    directory = shipped_bundle_dir("qwen2.5-coder")
    if not directory.is_dir():
        pytest.skip("no bundle shipped yet")
    bundle = load_bundle(directory)
    profile = Profile.load(directory / "profile.json")
    assert 1 in profile.target_ms
    settings = bundle.index["settings"]
    _assert_adaptive_entries_replan(directory, bundle, profile, settings["max_budget"],
                                    settings["max_depth"])
    for entry in bundle.entries:
        acceptance = Acceptance.load(directory / entry.acceptance)
        tree = bundle.tree(entry.temperature)
        assert tree.expected_length(acceptance.p) == pytest.approx(entry.tokens_per_step)
        assert entry.predicted_speedup > 0
    assert "redwood tune" in (directory / "summary.md").read_text()
