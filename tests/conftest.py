"""Shared fixtures. The shipped real pair is loaded at most once per test session (7 GB +
2.5 GB in float32); tests that use it are marked `@pytest.mark.real`."""
from __future__ import annotations

import gc
import os

import pytest

from redwood.errors import RedwoodError

# Learnt n-gram rates persist between processes (measure/learned_rates.py); a test run must not
# depend on what an earlier run or the user's own requests taught them, nor teach them. Set
# before any test starts a CLI or server subprocess (they inherit it); the tests of the feature
# turn it on with a temporary cache.
os.environ["REDWOOD_LEARNED_RATES"] = "0"


def _skip_if_not_installed(err: RedwoodError):
    """Skip (not fail) when the part packages are simply absent (`make models` not run);
    any other problem, e.g. a corrupt package, fails the test."""
    if "is not installed" in str(err):
        pytest.skip(f"shipped model pair unavailable: {err}")
    raise err


@pytest.fixture(scope="session")
def shipped_pair():
    """(target, draft, tokenizer) of the shipped qwen2.5-coder pair, float32 on CPU."""
    from redwood.models.pair import load_pair

    try:
        target, draft, tokenizer = load_pair("qwen2.5-coder", dtype="float32", device="cpu")
    except RedwoodError as err:
        _skip_if_not_installed(err)
    yield target, draft, tokenizer
    del target, draft
    gc.collect()


@pytest.fixture(scope="session")
def shipped_tokenizer():
    """The shipped pair's tokenizer alone: never builds the float cache (read from the GGUF
    once, about 15 s, then loads in about a second)."""
    from redwood.models.hf_loading import load_tokenizer
    from redwood.models.shipped import shipped_tokenizer_dir

    try:
        return load_tokenizer(shipped_tokenizer_dir())
    except RedwoodError as err:
        _skip_if_not_installed(err)


@pytest.fixture(autouse=True)
def _threads_for_test_size(request):
    """Tiny-model tests run single-threaded: on a 2-core machine OpenMP's barriers make
    each tiny op cost milliseconds when other work competes for the cores. Tests of the
    real pair keep every core."""
    import os

    import torch

    wanted = os.cpu_count() if request.node.get_closest_marker("real") else 1
    previous = torch.get_num_threads()
    torch.set_num_threads(wanted)
    yield
    torch.set_num_threads(previous)
