"""The first-use machine profile: keyed by what the timings depend on, cached, invalidated when
the key changes; bundles are re-planned against it, never against another machine's latencies."""
from __future__ import annotations

import json

import pytest
import torch

from redwood.backends.hf import HFBackend
from redwood.measure import machine_profile as mp
from redwood.plan.formats import Acceptance, Profile
from redwood.plan.tree import Tree, chain
from redwood.models.tiny_random import tiny_model


@pytest.fixture(scope="module")
def backends():
    return HFBackend(tiny_model(vocab_size=64, seed=0)), HFBackend(tiny_model(vocab_size=64, seed=1))


def fake_measure(target_ms, draft_ms):
    calls = []

    def measure(target, draft, sizes, progress):
        calls.append(list(sizes))
        return Profile(target_ms={n: target_ms(n) for n in sizes},
                       draft_ms={n: draft_ms(n) for n in sizes}, device="cpu: test")
    return measure, calls


def test_measured_once_then_cached(tmp_path, backends):
    measure, calls = fake_measure(lambda n: 30.0 + n, lambda n: 5.0)
    first = mp.machine_profile(*backends, sizes=[1, 2, 4], cache_dir=tmp_path, progress=False,
                               measure=measure)
    again = mp.machine_profile(*backends, sizes=[1, 2, 4], cache_dir=tmp_path, progress=False,
                               measure=measure)
    assert calls == [[1, 2, 4]]
    assert again.target_ms == first.target_ms == {1: 31.0, 2: 32.0, 4: 34.0}
    assert again.extra["machine_key"]["cpu"] == mp.cpu_model()


def test_a_profile_without_the_sizes_asked_for_is_measured_again(tmp_path, backends):
    """Grown trees need t(40) and t(48): a cached profile of sizes 1..32 must not serve a
    request for sizes up to 48 (the growth limit would silently stay at 32)."""
    measure, calls = fake_measure(lambda n: 30.0 + n, lambda n: 5.0)
    mp.machine_profile(*backends, sizes=[1, 2, 4], cache_dir=tmp_path, progress=False,
                       measure=measure)
    wider = mp.machine_profile(*backends, sizes=[1, 2, 4, 8], cache_dir=tmp_path,
                               progress=False, measure=measure)
    assert calls == [[1, 2, 4], [1, 2, 4, 8]] and max(wider.target_ms) == 8
    mp.machine_profile(*backends, sizes=[1, 2, 4, 8], cache_dir=tmp_path, progress=False,
                       measure=measure)
    assert len(calls) == 2                                  # and that one is cached in turn


@pytest.mark.parametrize("field, value", [("cpu", "Some Other CPU"), ("threads", 64),
                                          ("backend", "llamacpp"), ("cpu_flags", "0123abcd")])
def test_a_profile_of_another_machine_is_not_used(tmp_path, backends, field, value):
    """Copy a cached profile, alter one key field (as if measured elsewhere): it is ignored
    and this machine is measured."""
    measure, calls = fake_measure(lambda n: 30.0 + n, lambda n: 5.0)
    mp.machine_profile(*backends, sizes=[1, 2], cache_dir=tmp_path, progress=False, measure=measure)
    path = next((tmp_path / "profiles").glob("*.json"))
    data = json.loads(path.read_text())
    data["machine_key"][field] = value
    data["target_ms"] = {"1": 999.0, "2": 999.0}
    path.write_text(json.dumps(data))
    profile = mp.machine_profile(*backends, sizes=[1, 2], cache_dir=tmp_path, progress=False,
                                 measure=measure)
    assert len(calls) == 2 and profile.target_ms[1] == 31.0


def test_key_changes_with_the_models(backends):
    target, draft = backends
    other = HFBackend(tiny_model(vocab_size=64, seed=2, dtype=torch.float64))
    assert mp.profile_key(target, draft) != mp.profile_key(target, other)


def test_damaged_cache_is_measured_again(tmp_path, backends):
    measure, calls = fake_measure(lambda n: 30.0, lambda n: 5.0)
    mp.machine_profile(*backends, sizes=[1], cache_dir=tmp_path, progress=False, measure=measure)
    next((tmp_path / "profiles").glob("*.json")).write_text("{not json")
    mp.machine_profile(*backends, sizes=[1], cache_dir=tmp_path, progress=False, measure=measure)
    assert len(calls) == 2


def _bundle(tmp_path, p):
    from redwood.measure.bundles import load_bundle

    directory = tmp_path / "bundle"
    directory.mkdir()
    chain(3).save(directory / "tree-0.json")
    chain(8).save(directory / "adaptive-0.json")
    Acceptance(p=p, temperature=0.0).save(directory / "acceptance-0.json")
    (directory / "bundle.json").write_text(json.dumps({
        "format": 1, "kind": "bundle", "settings": {"max_budget": 16, "max_depth": 8},
        "trees": [{"temperature": 0.0, "top_p": 1.0, "tree": "tree-0.json",
                   "acceptance": "acceptance-0.json", "budget": 3, "depth": 3,
                   "tokens_per_step": 2.0, "predicted_speedup": 1.5,
                   "adaptive": {"tree": "adaptive-0.json", "draft_confidence": 0.6,
                                "threshold_from": "given"}}]}))
    return load_bundle(directory)


def test_replan_follows_this_machines_costs(tmp_path):
    """The same acceptance vector: a flat, cheap t(n) gets speculation; a steep t(n) with a
    costly draft gets plain decoding (a 1-node tree), whatever the bundle's own trees say."""
    bundle = _bundle(tmp_path, [0.9, 0.05])
    sizes = list(range(1, 17))
    cheap = Profile(target_ms={n: 30.0 + 0.5 * n for n in sizes}, draft_ms={n: 1.0 for n in sizes})
    steep = Profile(target_ms={n: 30.0 * n for n in sizes}, draft_ms={n: 25.0 for n in sizes})
    fast_tree, fast_c = mp.replan(bundle, 0.0, cheap, draft_confidence=0)
    slow_tree, _ = mp.replan(bundle, 0.0, steep, draft_confidence=0)
    assert len(fast_tree) > 3 and slow_tree == Tree([-1])
    assert fast_c == 0.0
    adaptive_tree, threshold = mp.replan(bundle, 0.0, cheap)      # None: adaptive, measured C kept
    assert threshold == 0.6 and len(adaptive_tree) >= len(fast_tree)
    none_tree, _ = mp.replan(bundle, 0.0, steep)
    assert len(none_tree) == 1                                      # never speculates then


def _tiny_pair_with_bundle(tmp_path, monkeypatch, shipped_tokenizer):
    """A tiny target/draft pair saved as HF directories, a bundle beside them, a fresh cache."""
    model = tiny_model(vocab_size=64, hidden_size=16, num_layers=1)
    for name in ("target", "draft"):
        model.save_pretrained(tmp_path / name)
    shipped_tokenizer.save_pretrained(tmp_path / "target")
    monkeypatch.setenv("REDWOOD_CACHE", str(tmp_path / "cache"))
    return _bundle(tmp_path, [0.9, 0.05])


def test_load_engine_plans_the_bundle_for_this_machine(tmp_path, monkeypatch, shipped_tokenizer):
    """load_engine with a bundle measures this machine once (tiny models: fast) and uses the
    re-planned tree, not the bundle's."""
    from redwood.cli.textgen import ModelConfig, load_engine

    bundle = _tiny_pair_with_bundle(tmp_path, monkeypatch, shipped_tokenizer)
    config = ModelConfig(target=str(tmp_path / "target"), draft=str(tmp_path / "draft"),
                         tree=str(bundle.directory), draft_confidence=0.0, backend="hf")
    engine, _ = load_engine(config, progress=False, temperature=0.0)
    assert engine.tree.source.get("profile") == "this machine (first-use profile)"
    assert list((tmp_path / "cache" / "profiles").glob("*.json"))


def test_transformers_engines_grow_their_trees_by_default(tmp_path, monkeypatch, shipped_tokenizer):
    """With a tuned bundle on the transformers backend and no explicit threshold, load_engine
    grows each step's tree inside the bundle's growth limit; --no-grow (grow=False) keeps the
    re-planned governed tree; an explicit threshold, another drafter or llama.cpp do not grow
    unless asked."""
    from dataclasses import replace

    from redwood.cli.textgen import ModelConfig, grows_by_default, load_engine

    bundle = _tiny_pair_with_bundle(tmp_path, monkeypatch, shipped_tokenizer)
    config = ModelConfig(target=str(tmp_path / "target"), draft=str(tmp_path / "draft"),
                         tree=str(bundle.directory), backend="hf")
    grown, _ = load_engine(config, progress=False, temperature=0.0)
    assert grown.drafter.growth is not None and grown.draft_confidence == 0.0
    assert grown.tree.source.get("kind") in ("growth limit", "plain")
    plain, _ = load_engine(replace(config, grow=False), progress=False, temperature=0.0)
    assert plain.drafter.growth is None
    assert plain.tree.source.get("profile") == "this machine (first-use profile)"
    assert grows_by_default(config, "hf", bundle)
    assert not grows_by_default(config, "llamacpp", bundle)
    assert not grows_by_default(config, "hf", None)
    assert not grows_by_default(replace(config, draft_confidence=0.5), "hf", bundle)
    assert not grows_by_default(replace(config, drafter="ngram"), "hf", bundle)


def test_cpu_flags_digest_tells_machines_of_one_model_name_apart():
    avx2 = "model name\t: AMD EPYC\nflags\t\t: fpu sse avx avx2 fma\n"
    avx512 = "model name\t: AMD EPYC\nflags\t\t: fpu sse avx avx2 fma avx512f avx512_vnni\n"
    assert mp.cpu_flags_digest(avx2) != mp.cpu_flags_digest(avx512)
    assert mp.cpu_flags_digest(avx2) == mp.cpu_flags_digest(avx2.replace("avx avx2", "avx2 avx"))
    assert mp.cpu_flags_digest("model name : x\n") == ""
