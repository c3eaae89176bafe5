"""Run a one-time measurement on a thread of its own, so it leaves no OpenMP team behind.

llama.cpp's CPU backend computes with OpenMP (libgomp). libgomp keeps a pool of worker threads
for every thread that has started a parallel region, for as long as that thread lives, and it
counts the workers of every pool in the process: once they outnumber the CPUs, every pool's
workers stop spinning at barriers after ~1,000 iterations and sleep instead, so each of the
hundreds of barriers in a forward pays a futex wake-up. A server measures its first-use profile
on the main thread and then decodes on its engine thread: two pools of 2 on 2 cores, and every
later step ran 20 % slower (measured on a 2-core AMD EPYC: 8.3-8.9 s against 6.8-7.2 s for the
same 200 tokens from a server whose profile came from the cache; a plain llama-cpp-python
decode 48 ms a step after a main-thread warm-up against 37-41 ms without one).

A thread that exits takes its pool with it (libgomp frees a thread's pool in its thread-exit
destructor), so measuring on a short-lived thread leaves only the pool of the thread that
decodes afterwards.
"""
from __future__ import annotations

import threading


def run_on_fresh_thread(fn, *args, name: str = "redwood-measure"):
    """fn(*args) on a new thread, joined before returning; its result, or its exception re-raised
    here. The thread is a daemon, so Ctrl-C during a long measurement ends the process instead of
    waiting for the measurement to finish."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = fn(*args)
        except BaseException as exc:           # handed to the caller, raised on its thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
