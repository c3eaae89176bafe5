"""The first-use measurement runs on a thread of its own and leaves no OpenMP team behind
(measure/fresh_thread.py: a team left on the main thread slowed the server's decodes 20 %)."""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from redwood.measure import machine_profile as mp
from redwood.measure.fresh_thread import run_on_fresh_thread
from tiny_gguf import tiny_gguf_pair  # noqa: F401  (session fixture)


def test_runs_elsewhere_and_returns_the_value():
    caller = threading.get_ident()
    seen = []
    value = run_on_fresh_thread(lambda x: seen.append(threading.get_ident()) or x * 2, 21)
    assert value == 42 and seen and seen[0] != caller


def test_an_error_reaches_the_caller():
    def fail():
        raise ValueError("measurement failed")

    with pytest.raises(ValueError, match="measurement failed"):
        run_on_fresh_thread(fail)


def test_the_cache_measures_off_the_callers_thread_once(tmp_path):
    threads = []

    def make(path):
        threads.append(threading.current_thread())
        path.write_text("1")
        return "measured"

    load = lambda path, key: path.read_text() if path.is_file() else None   # noqa: E731
    assert mp.cached(tmp_path, {"k": 1}, load, make, fresh_thread=True) == "measured"
    assert mp.cached(tmp_path, {"k": 1}, load, make, fresh_thread=True) == "1"   # cached
    assert len(threads) == 1 and threads[0] is not threading.current_thread()
    assert not threads[0].is_alive()
    # torch-only measurements (the kernel choice) stay on the caller's thread
    assert mp.cached(tmp_path, {"k": 2}, load, make) == "measured"
    assert threads[1] is threading.current_thread()


# Runs in fresh interpreters: pytest's main thread has decoded in other tests already, so its
# OpenMP team exists whatever this test does; a new process starts with none. The same
# measurement made directly on the main thread is the control: it keeps its team's worker.
SCRIPT = """
import os, sys, time
from redwood.backends.llamacpp import LlamaCppBackend
from redwood.measure import machine_profile as mp
target, draft, cache, how = sys.argv[1:5]
pair = [LlamaCppBackend(p, n_ctx=1280, n_threads=2) for p in (target, draft)]
if how == "first-use":
    mp.machine_profile(*pair, sizes=[1, 2, 4], cache_dir=cache, progress=False)
else:
    mp._measure(*pair, [1, 2, 4], False)
# A finished thread's OS thread, and the workers its OpenMP team releases, exit a moment after
# join() returns: count once they have had time to.
time.sleep(2.0)
print(len(os.listdir("/proc/self/task")))
"""


def threads_after(how: str, pair, cache: Path) -> int:
    done = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, pair), str(cache), how],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_a_first_use_profile_leaves_no_openmp_worker_behind(tiny_gguf_pair, tmp_path):
    on_main = threads_after("main", tiny_gguf_pair, tmp_path / "a")
    first_use = threads_after("first-use", tiny_gguf_pair, tmp_path / "b")
    # two threads decode (n_threads=2): the main thread's team keeps one worker; the first-use
    # path's team ended with its thread
    assert first_use == on_main - 1, (first_use, on_main)
