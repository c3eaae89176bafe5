"""`redwood profile`: sizes, a valid Profile covering every budget, cache hygiene, CLI."""
import json

import pytest
import torch

from redwood.backends import hf_cache as kvcache
from redwood.cli.main import main
from redwood.errors import RedwoodError
from redwood.plan.formats import Profile
from redwood.plan.planner import choose_tree
from redwood.measure.profile import _Bench, default_sizes, model_dtype, profile_latency, timing_tree
from redwood.models.tiny_random import tiny_pair


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab_size=64, num_layers=2, hidden_size=32)


def test_default_sizes_cover_every_small_budget_then_steps():
    assert default_sizes(128) == list(range(1, 33)) + [48, 64, 96, 128]
    assert default_sizes(256) == list(range(1, 33)) + [48, 64, 96, 128, 192, 256]
    assert default_sizes(100) == list(range(1, 33)) + [48, 64, 96]
    assert default_sizes(10) == list(range(1, 11))
    with pytest.raises(RedwoodError):
        default_sizes(0)


@pytest.mark.parametrize("n", [1, 2, 7, 20, 48])
def test_timing_tree_has_n_nodes_and_a_tree_shape(n):
    tree = timing_tree(n)
    assert len(tree) == n and tree.num_levels <= 8
    if n >= 20:
        assert tree.max_width > 1 and tree.num_levels > 2      # neither a chain nor a star


def test_profile_covers_budgets_and_widths(tmp_path, pair):
    target, draft = pair
    budgets = default_sizes(40)
    profile = profile_latency(target, draft, context=24, budgets=budgets, widths=[1, 2, 4, 8],
                              repeats=2, warmup=1, progress=False)
    assert sorted(profile.target_ms) == budgets
    assert sorted(profile.draft_ms) == [1, 2, 4, 8]
    assert all(t > 0 for t in [*profile.target_ms.values(), *profile.draft_ms.values()])
    assert profile.context == 24 and profile.dtype == "float32"
    assert profile.device.startswith("cpu")
    samples = profile.extra["samples_ms"]
    assert all(len(v) == 2 for v in [*samples["target"].values(), *samples["draft"].values()])
    for n, times in samples["target"].items():            # the reported value is the median
        assert profile.target_ms[int(n)] == pytest.approx(sum(times) / 2)
    loaded = Profile.load(profile.save(tmp_path / "p.json"))
    assert loaded.target_ms == profile.target_ms and loaded.draft_ms == profile.draft_ms
    choice = choose_tree([0.8, 0.1], loaded, 40, 6)       # the planner accepts it
    assert choice.budget in budgets


def test_timed_forward_leaves_the_cache_at_the_context(pair):
    from redwood.backends.hf import HFBackend

    target, draft = pair
    context = torch.arange(2, 18)
    generator = torch.Generator().manual_seed(0)
    for shape, model in (("tree", target), ("level", draft)):
        backend = HFBackend(model)
        bench = _Bench(backend, context, shape)
        for n in (1, 5, 12):
            bench.prepare(n, 64, generator)
            tree, nodes, ids, root_position = bench.inputs[n]
            if shape == "tree":                # the planner's shape, root included, after the context
                assert tree == timing_tree(n) and nodes == list(range(n))
                assert root_position == len(context)
            else:                              # one level of n siblings under a committed root
                assert nodes == list(range(1, n + 1)) and root_position == len(context) - 1
            assert len(ids) == len(nodes)
            bench.run(n)
            assert backend.cache_length() == len(context)
            assert kvcache.cache_length(backend.cache) == len(context)


def test_int8_and_fast_linear_are_recorded(pair):
    import copy

    from redwood.models.cpu_kernels import enable_fast_linear, quantize_int8

    target, draft = pair
    assert model_dtype(target) == "float32"
    assert model_dtype(quantize_int8(copy.deepcopy(draft))) == "int8-dynamic+float32"
    fast = copy.deepcopy(target)
    enable_fast_linear(fast)
    profile = profile_latency(fast, draft, context=8, budgets=[1, 4], repeats=1, warmup=0,
                              progress=False)
    assert profile.extra["fast_linear"] == {"target": True, "draft": False}


@pytest.mark.parametrize("kwargs, message", [
    ({"budgets": [2, 4]}, "include 1"),
    ({"widths": []}, "non-empty"),
    ({"repeats": 0}, "repeats"),
    ({"context": 1020}, "positions"),
])
def test_bad_arguments(pair, kwargs, message):
    with pytest.raises(RedwoodError, match=message):
        profile_latency(*pair, **{"budgets": [1, 2], "progress": False, **kwargs})


def test_cli_quick_profile(tmp_path, capsys):
    out, plot = tmp_path / "p.json", tmp_path / "p.png"
    rc = main(["profile", "--quick", "--max-budget", "6", "--context", "16", "--repeats", "1",
               "--warmup", "0", "--out", str(out), "--plot", str(plot)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "profile" and list(data["target_ms"]) == [str(n) for n in range(1, 7)]
    assert data["source"]["tool"] == "redwood profile" and "--quick" in data["source"]["target"]
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert "target ms" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--max-budget", "0"], "max budget"),
    (["--out", "{tmp}/no/such/dir/p.json"], "does not exist"),
    (["--out", "{tmp}"], "is a directory"),
])
def test_cli_bad_input_exits_2(tmp_path, capsys, argv, message):
    argv = [a.format(tmp=tmp_path) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "p.json")]
    rc = main(["profile", "--quick", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err
