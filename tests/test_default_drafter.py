"""The default drafter (cli.textgen.default_drafter): prompt lookup on llama.cpp, the draft
model on transformers; and the batched server's `--drafter auto`
(serve.batch_setup.model_declines): prompt lookup where none of the bundle's draft-model trees
pays on this machine's profile, else the draft model."""
from __future__ import annotations

import pytest

from redwood.cli.textgen import default_drafter
from redwood.measure.bundles import load_bundle, shipped_bundle_dir
from redwood.plan.formats import Profile
from redwood.serve.batch_setup import model_declines
from tiny_gguf import tiny_gguf_pair  # noqa: F401  (fixture)

# verifying k tokens costs nearly k steps and a draft level most of a target token (a 2-core CPU)
STEEP = Profile({n: 37.0 * n ** 0.9 for n in range(1, 33)}, {w: 22.0 * w ** 0.8 for w in range(1, 33)})
# extra tokens nearly free and the draft cheap (a GPU-like machine)
CHEAP = Profile({n: 30.0 + 0.5 * n for n in range(1, 33)}, {w: 0.5 for w in range(1, 33)})


def test_default_is_prompt_lookup_on_llamacpp_else_the_model():
    assert default_drafter(None, "llamacpp") == "ngram"
    assert default_drafter(None, "hf") == "model"          # grown model trees there
    assert default_drafter(None, "llamacpp", tree_file=True) == "model"   # a tree for the model
    for asked in ("model", "ngram", "hybrid", "auto"):
        assert default_drafter(asked, "llamacpp") == asked
        assert default_drafter(asked, "hf") == asked


@pytest.mark.parametrize("backend", ["llamacpp", "hf"])
def test_the_batched_auto_drafts_by_lookup_only_where_no_model_tree_pays(backend):
    bundle = load_bundle(shipped_bundle_dir(backend=backend))
    assert model_declines(STEEP, bundle)
    assert not model_declines(CHEAP, bundle)


def test_generate_on_gguf_files_drafts_by_prompt_lookup_by_default(tiny_gguf_pair, capsys,
                                                                    tmp_path, monkeypatch):
    """`redwood generate` on llama.cpp without --drafter: the n-gram drafter (its proposals
    are the only drafted tokens), this machine's profile measured once, and the output is what
    the draft model's path (an explicit --drafter model) decodes greedily."""
    import json

    from redwood.cli.main import main

    target, draft = tiny_gguf_pair
    monkeypatch.setenv("REDWOOD_CACHE", str(tmp_path / "cache"))
    prompt = "abc abc abc abc abc abc ab"
    records = {}
    for extra in ([], ["--drafter", "model"]):
        assert main(["generate", "--target", str(target), "--draft", str(draft), prompt,
                     "--max-new-tokens", "16", "--ignore-eos", "--json", *extra]) == 0
        records[tuple(extra)] = json.loads(capsys.readouterr().out)
    default, model = records[()], records[("--drafter", "model")]
    assert default["tokens"] == model["tokens"] and sum(default["accepted"]) == 16
    assert default["draft_forwards"] == 0 and set(default["accepted_by_source"]) <= {"ngram"}
    assert default["acceptance_by_match"] and not model.get("acceptance_by_match")
    assert 0.05 <= default["draft_ratio"] <= 1.5 and model["draft_ratio"] is None
    assert any((tmp_path / "cache").rglob("*.json")), "no machine profile was cached"


def test_the_demo_says_which_drafter_decides():
    """The demo's planner line names what the engine really drafts with: prompt lookup (the
    default on llama.cpp), `auto` in its free-drafts mode, or the hybrid weighing both."""
    from types import SimpleNamespace

    from redwood.cli.demo import planner_line
    from redwood.decode.hybrid_drafter import HybridDrafter
    from redwood.decode.ngram_drafter import NgramDrafter
    from redwood.decode.ngram_trees import ngram_budget_tree

    tree = ngram_budget_tree()
    engine = SimpleNamespace(drafter=NgramDrafter(), tree=tree, profile=STEEP)
    line = planner_line(engine, SimpleNamespace(drafter=None, tree=None))
    assert "prompt-lookup" in line and "t(1) = 37 ms" in line
    for mode, expected in (("ngram", "no draft-model tree beats plain decoding"),
                           ("hybrid", "weighs the free n-gram tree")):
        hybrid = object.__new__(HybridDrafter)
        hybrid.plans = lambda temperature, mode=mode: (tree, 2.0, mode)
        engine = SimpleNamespace(drafter=hybrid, tree=tree, profile=STEEP)
        assert expected in planner_line(engine, SimpleNamespace(drafter="auto", tree=None))
