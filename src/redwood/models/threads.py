"""Torch CPU threads: one per physical core this process may use (cgroup quotas included)."""
from __future__ import annotations

import os
from pathlib import Path

import torch


def _cgroup_cpu_limit() -> int | None:
    """Whole CPUs allowed by a cgroup v2 quota (containers), None when unlimited/unknown."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else max(1, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        return None


def sensible_thread_count() -> int:
    """One thread per physical core this process may use: hyperthreads and oversubscribing a
    container's CPU quota only add contention in GEMM-bound decoding. REDWOOD_THREADS or
    OMP_NUM_THREADS override."""
    chosen = os.environ.get("REDWOOD_THREADS") or os.environ.get("OMP_NUM_THREADS")
    if chosen and chosen.isdigit() and int(chosen) > 0:
        return int(chosen)
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        import psutil
        physical = psutil.cpu_count(logical=False) or available
    except ImportError:
        physical = available
    limits = [n for n in (available, physical, _cgroup_cpu_limit()) if n]
    return max(1, min(limits)) if limits else 1


_threads_configured = False


def configure_threads(force: bool = False) -> int:
    """Set torch's intra-op threads to sensible_thread_count(), once per process (the first
    CPU load_model), so a later torch.set_num_threads by the caller is left alone."""
    global _threads_configured
    if _threads_configured and not force:
        return torch.get_num_threads()
    _threads_configured = True
    threads = sensible_thread_count()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
