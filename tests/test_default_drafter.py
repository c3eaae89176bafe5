"""The default drafter (cli.textgen.default_drafter, serve.batch_setup.model_declines): on
llama.cpp with a tuned bundle redwood drafts with the model only where the bundle's trees pay on
this machine's measured costs, else by prompt lookup; elsewhere the draft model."""
from __future__ import annotations

import pytest

from redwood.cli.textgen import default_drafter
from redwood.measure.bundles import load_bundle, shipped_bundle_dir
from redwood.plan.formats import Profile
from redwood.serve.batch_setup import model_declines

# verifying k tokens costs nearly k steps and a draft level most of a target token (a 2-core CPU)
STEEP = Profile({n: 37.0 * n ** 0.9 for n in range(1, 33)}, {w: 22.0 * w ** 0.8 for w in range(1, 33)})
# extra tokens nearly free and the draft cheap (a GPU-like machine)
CHEAP = Profile({n: 30.0 + 0.5 * n for n in range(1, 33)}, {w: 0.5 for w in range(1, 33)})


def test_default_is_auto_on_llamacpp_with_a_bundle_else_the_model():
    bundle = load_bundle(shipped_bundle_dir(backend="llamacpp"))
    assert default_drafter(None, "llamacpp", bundle) == "auto"
    assert default_drafter(None, "llamacpp", None) == "model"      # own GGUFs: nothing to plan
    assert default_drafter(None, "hf", bundle) == "model"          # grown model trees there
    for asked in ("model", "ngram", "hybrid", "auto"):
        assert default_drafter(asked, "llamacpp", bundle) == asked


@pytest.mark.parametrize("backend", ["llamacpp", "hf"])
def test_the_batched_auto_drafts_by_lookup_only_where_no_model_tree_pays(backend):
    bundle = load_bundle(shipped_bundle_dir(backend=backend))
    assert model_declines(STEEP, bundle)
    assert not model_declines(CHEAP, bundle)
