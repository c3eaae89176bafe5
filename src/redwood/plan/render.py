"""Pictures of trees and plans: ASCII for the terminal, matplotlib figures for files.

matplotlib is imported only inside the plotting functions (and never pyplot: figures are
built with `matplotlib.figure.Figure`, so no GUI backend or global state is touched).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


# --- ASCII -------------------------------------------------------------------------------

def render_ascii(tree, p=None, max_nodes: int = 200) -> str:
    """One line per node, depth-first, siblings in rank order:

        0 root          1.0000
        |-- 1 r1        0.9100
        |   `-- 3 r1    0.8281
        `-- 2 r2        0.0500

    `N rK` is node index N, rank K among its siblings; the number on the right is the node's
    value (probability it is accepted) when p is given. Stops after `max_nodes` lines.
    """
    values = tree.node_values(p) if p is not None else None
    lines: list[str] = []
    shown: list[int] = []
    stack = [(0, "", "")]                        # (node, prefix of its line, prefix of children)
    while stack and len(lines) < max_nodes:
        node, lead, child_lead = stack.pop()
        lines.append(lead + ("0 root" if node == 0 else f"{node} r{int(tree.ranks[node])}"))
        shown.append(node)
        kids = tree.children[node]
        for k in range(len(kids) - 1, -1, -1):   # push in reverse so rank 1 pops first
            last = k == len(kids) - 1
            stack.append((kids[k], child_lead + ("`-- " if last else "|-- "),
                          child_lead + ("    " if last else "|   ")))
    if values is not None:                       # align the values in one column
        width = max(len(line) for line in lines) + 2
        lines = [f"{line:<{width}}{values[node]:.4f}" for line, node in zip(lines, shown)]
    hidden = len(tree) - len(lines)
    if hidden > 0:
        lines.append(f"... ({hidden} more nodes not shown)")
    return "\n".join(lines)


def describe_tree(tree, p=None) -> str:
    """One summary line: size, levels, nodes per level, expected tokens per step."""
    text = (f"tree: {len(tree)} nodes, {tree.num_levels} levels (root = level 1), "
            f"nodes per level {tree.level_sizes}")
    if p is not None:
        text += f"\nexpected tokens per step: {tree.expected_length(p):.4f}"
    return text


def format_candidates(choice) -> str:
    """The hardware-aware comparison: for each measured budget the best depth's row
    (chosen row marked *), then the decision."""
    best: dict[int, object] = {}
    for c in choice.candidates:
        if c.tokens_per_second is None:
            continue
        if c.budget not in best or c.tokens_per_second > best[c.budget].tokens_per_second:
            best[c.budget] = c
    head = (f"  {'n':>5} {'d':>3} {'tokens/step':>11} {'target ms':>10} {'draft ms':>9} "
            f"{'step ms':>9} {'tokens/s':>9} {'speedup':>8}")
    lines = ["candidates (best depth per measured budget; draft time per level = "
             "measured width at or above the level's width):", head]
    for n in sorted(best):
        c = best[n]
        mark = "*" if (c.budget, c.depth) == (choice.budget, choice.depth) else " "
        lines.append(f"{mark} {c.budget:>5} {c.depth:>3} {c.expected_length:>11.3f} "
                     f"{c.target_ms:>10.1f} {c.draft_ms:>9.1f} {c.step_ms:>9.1f} "
                     f"{c.tokens_per_second:>9.3f} {c.speedup:>7.3f}x")
    skipped = sum(c.tokens_per_second is None for c in choice.candidates)
    if skipped:
        lines.append(f"({skipped} candidates skipped: a level wider than any measured draft width)")
    lines.append(f"chosen: n = {choice.budget}, d = {choice.depth}: "
                 f"{choice.tokens_per_step:.3f} tokens per {choice.step_ms:.1f} ms step, "
                 f"predicted speedup {choice.speedup:.3f}x over plain decoding")
    return "\n".join(lines)


# --- matplotlib --------------------------------------------------------------------------

def tree_layout(tree) -> tuple[np.ndarray, np.ndarray]:
    """x, y coordinates [n]: leaves at consecutive x in depth-first order, parents centred
    over their children, y = -depth."""
    n = len(tree)
    x = np.zeros(n)
    next_leaf = 0.0
    order = []                                   # depth-first preorder
    stack = [0]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(tree.children[node]))
    for node in order:
        if not tree.children[node]:
            x[node] = next_leaf
            next_leaf += 1.0
    for node in reversed(order):                 # children before parents
        if tree.children[node]:
            x[node] = np.mean(x[tree.children[node]])
    return x, -tree.depths.astype(float)


def plot_tree(tree, ax, p=None, title: str | None = None) -> None:
    """Draw the tree on a matplotlib Axes; nodes coloured by value when p is given."""
    x, y = tree_layout(tree)
    for i in range(1, len(tree)):
        par = tree.parents[i]
        ax.plot([x[par], x[i]], [y[par], y[i]], color="0.6", linewidth=0.8, zorder=1)
    colour = tree.node_values(p) if p is not None else np.ones(len(tree))
    size = max(12.0, 220.0 / max(1.0, np.sqrt(len(tree))))
    points = ax.scatter(x, y, c=colour, cmap="viridis", vmin=0.0, vmax=1.0, s=size,
                        zorder=2, edgecolors="k", linewidths=0.4)
    if len(tree) <= 48:
        for i in range(1, len(tree)):
            ax.annotate(str(int(tree.ranks[i])), (x[i], y[i]), textcoords="offset points",
                        xytext=(0, -(np.sqrt(size) / 2 + 7)), ha="center", fontsize=7)
    if p is not None:
        ax.figure.colorbar(points, ax=ax, label="node value (P accepted)", shrink=0.8)
    ax.set_yticks(-np.arange(tree.num_levels))
    ax.set_yticklabels([str(k + 1) for k in range(tree.num_levels)])
    ax.set_ylabel("level (root = 1)")
    ax.set_xticks([])
    ax.set_title(title or f"tree: {len(tree)} nodes, {tree.num_levels} levels")


def plot_expected_length(table, ax, depths=None) -> None:
    """Expected tokens per step G(n, d) against budget n, one line per depth d."""
    if depths is None:
        depths = _spread(table.max_depth, 6)
    n = np.arange(1, table.budget + 1)
    for d in depths:
        g = table.values[1:, d]
        ok = np.isfinite(g)
        ax.plot(n[ok], g[ok], label=f"d = {d}", linewidth=1.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("budget n (tree nodes incl. root)")
    ax.set_ylabel("expected tokens per step G(n, d)")
    ax.set_title("DP optimum vs budget")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def plot_speedup(choice, ax) -> None:
    """Predicted speedup over plain decoding vs measured budget (best depth per budget),
    with a faint line per depth and the chosen point marked."""
    by_budget: dict[int, float] = {}
    by_depth: dict[int, list[tuple[int, float]]] = {}
    for c in choice.candidates:
        if c.speedup is None:
            continue
        by_budget[c.budget] = max(by_budget.get(c.budget, 0.0), c.speedup)
        by_depth.setdefault(c.depth, []).append((c.budget, c.speedup))
    for d in _spread(max(by_depth), 6):
        if d in by_depth and d > 1:
            pts = np.array(by_depth[d])
            ax.plot(pts[:, 0], pts[:, 1], linewidth=0.8, alpha=0.5, label=f"d = {d}")
    budgets = sorted(by_budget)
    ax.plot(budgets, [by_budget[n] for n in budgets], "k-o", markersize=4, label="best d")
    ax.plot([choice.budget], [choice.speedup], "r*", markersize=14,
            label=f"chosen n={choice.budget}, d={choice.depth}")
    ax.axhline(1.0, color="0.5", linestyle="--", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("measured budget n")
    ax.set_ylabel("predicted speedup vs plain decoding")
    ax.set_title("hardware-aware choice")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def save_plan_figure(path, tree, table, p=None, choice=None) -> Path:
    """One PNG/PDF/SVG: the tree, G(n, d) vs budget, and (with a choice) speedup vs budget."""
    from matplotlib.figure import Figure

    panels = 3 if choice is not None else 2
    fig = Figure(figsize=(6.0 * panels, 5.0), layout="constrained")
    axes = fig.subplots(1, panels)
    plot_tree(tree, axes[0], p=p)
    plot_expected_length(table, axes[1])
    if choice is not None:
        plot_speedup(choice, axes[2])
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def _spread(max_depth: int, count: int) -> list[int]:
    """Up to `count` depths from 2..max_depth, roughly evenly spaced (always the largest)."""
    if max_depth <= 1:
        return [1]
    picks = np.unique(np.linspace(2, max_depth, num=min(count, max_depth - 1)).round().astype(int))
    return [int(d) for d in picks]
