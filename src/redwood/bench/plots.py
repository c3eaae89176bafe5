"""The benchmark's plots: speedup by method and setting, measured vs predicted tokens per
step, the acceptance vectors used, and where the decode time goes."""
from __future__ import annotations

from pathlib import Path

from redwood.bench.common import METHOD_LABELS


def save_plots(doc: dict, out: Path, stem: str) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["summary"]
    paths = {}
    for key, draw in (("plot_speedup", _speedup), ("plot_tokens_per_step", _tokens_per_step),
                      ("plot_acceptance", _acceptance), ("plot_time_split", _time_split)):
        fig = draw(plt, rows, doc)
        if fig is None:
            continue
        path = out / f"{stem}-{key.removeprefix('plot_').replace('_', '-')}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths[key] = path
    return paths


def _settings(rows):
    return sorted({(r["temperature"], r["top_p"]) for r in rows})


def _groups(rows):
    """(prompt set, T, top_p) in the rows' order of sets, then by setting."""
    sets = list(dict.fromkeys(r.get("prompt_set", "humaneval") for r in rows))
    return [(s, t, p) for s in sets for t, p in _settings(
        [r for r in rows if r.get("prompt_set", "humaneval") == s])]


def _methods(rows):
    order = list(METHOD_LABELS)
    return sorted({r["method"] for r in rows}, key=lambda m: order.index(m) if m in order else 99)


def _speedup(plt, rows, doc):
    key, label = "speedup_vs_autoregressive", "speedup vs autoregressive (median)"
    if doc.get("backend") == "llamacpp":
        key, label = "speedup_vs_plain_llamacpp", "end-to-end speedup vs plain llama.cpp (median)"
    if all(r.get(key) is None for r in rows):
        return None
    settings, methods = _groups(rows), _methods(rows)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(settings)), 4))
    width = 0.8 / len(methods)
    for j, method in enumerate(methods):
        values = []
        for s, t, p in settings:
            match = [r for r in rows if (r["temperature"], r["top_p"]) == (t, p)
                     and r.get("prompt_set", "humaneval") == s and r["method"] == method]
            values.append(match[0][key] or 0 if match else 0)
        ax.bar([i + j * width for i in range(len(settings))], values, width,
               label=METHOD_LABELS.get(method, method))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(settings))])
    several = len({s for s, _, _ in settings}) > 1
    ax.set_xticklabels([(f"{s}\n" if several else "") + f"T={t:g}\ntop_p={p:g}"
                        for s, t, p in settings])
    ax.set_ylabel(label)
    ax.set_title(f"redwood bench: {doc['machine']}")
    ax.legend(fontsize=7, ncol=2)
    return fig


def _tokens_per_step(plt, rows, doc):
    points = [r for r in rows if r["predicted_tokens_per_step"] is not None]
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(5, 5))
    for method, marker in zip(_methods(points), "osD^v<>"):
        mine = [r for r in points if r["method"] == method]
        ax.scatter([r["predicted_tokens_per_step"] for r in mine],
                   [r["tokens_per_step"] for r in mine], label=METHOD_LABELS.get(method, method),
                   marker=marker, facecolors="none", edgecolors=f"C{list(METHOD_LABELS).index(method)}"
                   if method in METHOD_LABELS else None)
    top = max(max(r["predicted_tokens_per_step"], r["tokens_per_step"]) for r in points) * 1.1
    ax.plot([0, top], [0, top], color="black", linewidth=0.8)
    ax.fill_between([0, top], [0, 0.9 * top], [0, 1.1 * top], color="grey", alpha=0.15,
                    label="±10%")
    ax.set_xlabel("planner-predicted tokens per step")
    ax.set_ylabel("measured tokens per target forward")
    ax.legend(fontsize=7)
    return fig


def _acceptance(plt, rows, doc):
    if not doc["vectors"]:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for v in doc["vectors"]:
        p = v["p"][:16]
        ax.plot(range(1, len(p) + 1), p, marker="o", markersize=3,
                label=f"T={v['temperature']}, top_p={v['top_p']}, {v['method']}")
    ax.set_yscale("log")
    ax.set_xlabel("rank k")
    ax.set_ylabel("p_k (unconditional)")
    ax.set_title("acceptance vectors used")
    ax.legend(fontsize=7)
    return fig


def _time_split(plt, rows, doc):
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(rows) + 1.2))
    labels, left = [], [0.0] * len(rows)
    for part, color in (("target", "tab:blue"), ("draft", "tab:orange"), ("other", "tab:grey")):
        widths = [r["ms_per_token"] * r["time_split"][part] for r in rows]
        ax.barh(range(len(rows)), widths, left=left, color=color, label=part)
        left = [a + b for a, b in zip(left, widths)]
    labels = [f"{r.get('prompt_set', 'humaneval')}: {r['method']} {r['config']} "
              f"T={r['temperature']:g} p={r['top_p']:g}" for r in rows]
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("ms per new token (decode)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig
