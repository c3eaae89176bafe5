"""Figures of measurements: latency profiles t(n) and acceptance vectors p.

Like render.py, matplotlib is imported only inside the functions, and figures are built with
`matplotlib.figure.Figure` (no pyplot, no GUI backend, no global state).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_profile(profile, axes, label: str = "") -> None:
    """Two panels: forward time vs size for both models, and the target's t(n) / t(1)
    (what verifying n tree tokens costs relative to plain decoding)."""
    suffix = f" ({label})" if label else ""
    left, right = axes
    for name, times, style in (("target: tree of n", profile.target_ms, "o-"),
                               ("draft: level of n", profile.draft_ms, "s-")):
        n = np.array(sorted(times))
        left.plot(n, [times[k] for k in n], style, markersize=3, linewidth=1.2,
                  label=name + suffix)
    left.set_xscale("log", base=2)
    left.set_xlabel("tokens in one forward (n)")
    left.set_ylabel("median forward time (ms)")
    left.set_title(f"forward latency, context {profile.context}")
    left.grid(True, alpha=0.3)
    left.legend(fontsize=8)
    n = np.array(sorted(profile.target_ms))
    t1 = profile.target_ms[1]
    right.plot(n, [profile.target_ms[k] / t1 for k in n], "o-", markersize=3,
               label="target t(n) / t(1)" + suffix)
    right.plot(n, n, ":", color="0.6", label="n (no batching gain)")
    right.set_xscale("log", base=2)
    right.set_yscale("log", base=2)
    right.set_xlabel("tree tokens n")
    right.set_ylabel("cost relative to one token")
    right.set_title("verification cost of a tree")
    right.grid(True, alpha=0.3)
    right.legend(fontsize=8)


def save_profile_figure(path, profile, title: str | None = None) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12.0, 4.5), layout="constrained")
    plot_profile(profile, fig.subplots(1, 2))
    if title:
        fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def plot_acceptance(vectors: dict, ax, max_rank: int | None = None) -> None:
    """Grouped bars of p_k by rank, one group member per labelled vector
    (vectors: {label: Acceptance or array}); log scale so the small ranks show."""
    items = [(label, np.asarray(getattr(v, "p", v), dtype=float)) for label, v in vectors.items()]
    ranks = max_rank or max(len(p) for _, p in items)
    width = 0.8 / len(items)
    for i, (label, p) in enumerate(items):
        k = np.arange(1, min(ranks, len(p)) + 1)
        shown = np.where(p[: len(k)] > 0, p[: len(k)], np.nan)    # log scale: hide zeros
        ax.bar(k + (i - (len(items) - 1) / 2) * width, shown, width=width,
               label=f"{label} (sum {p.sum():.3f})")
    ax.set_yscale("log")
    ax.set_xlabel("rank k of the accepted child")
    ax.set_ylabel("p_k (unconditional)")
    ax.set_title("acceptance vectors")
    ax.set_xticks(np.arange(1, ranks + 1))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")


def save_acceptance_figure(path, vectors: dict, title: str | None = None) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 4.5), layout="constrained")
    plot_acceptance(vectors, fig.subplots(1, 1))
    if title:
        fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
