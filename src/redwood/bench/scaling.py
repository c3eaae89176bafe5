"""`redwood bench --scaling`: tokens gained per target forward against tree size (the Sequoia
paper's central figure), measured beside the planner's prediction.

For each temperature and each budget n in 1, 2, 4, ..., max_budget (nodes, root included):
- sequoia: the DP tree `planner.optimal_tree(p_T, n, min(n, max_depth))`;
- specinfer: the k x d tree with k >= 2 chains and 1 + k d <= n nodes that the specinfer
  vector predicts best (k = 1 would be the chain row again; n = 2 allows only 1 x 1);
- chain: the chain of n nodes.
Each is run on the evaluation prompts (interleaved per prompt, seeds fixed, EOS ignored) and
its pooled tokens per target forward is reported with the tree's expected length. A
generation's last step is cut to the token limit, so it is left out of the pooled figure
(short runs would otherwise understate large trees). This is a property of the models and
the trees, not of the machine's speed: no times are reported.
n = 1 is the root alone (plain decoding): 1 token per forward by definition, not run.
"""
from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

from redwood.bench.common import atomic_write, duration, machine_name
from redwood.bench.methods import MethodFactory
from redwood.errors import RedwoodError
from redwood.plan.tree import Tree, chain, specinfer

SCALING_METHODS = ("sequoia", "specinfer", "chain")


def budgets_up_to(max_budget: int) -> list[int]:
    """1, 2, 4, ... up to max_budget (max_budget itself included when not a power of 2)."""
    if isinstance(max_budget, bool) or not isinstance(max_budget, int) or max_budget < 1:
        raise RedwoodError(f"--max-budget must be an integer >= 1, got {max_budget!r}")
    out, n = [], 1
    while n <= max_budget:
        out.append(n)
        n *= 2
    return out if out[-1] == max_budget else out + [max_budget]


def best_specinfer(p, budget: int, min_chains: int = 2) -> Tree:
    """The k x d SpecInfer tree (k >= min_chains, 1 + k d <= budget nodes) with the largest
    expected length under p (ties: fewer nodes, then fewer chains); when no such tree fits,
    the best with fewer chains."""
    if budget - 1 < min_chains:
        min_chains = 1
    best, best_key = chain(1), (1.0, 0, 0)
    for k in range(min_chains, budget):
        for d in range(1, (budget - 1) // k + 1):
            tree = specinfer(k, d)
            key = (tree.expected_length(p), -len(tree), -k)
            if key > best_key:
                best, best_key = tree, key
    return best


def scaling_trees(inputs, temperature: float, top_p: float, budget: int, max_depth: int):
    """{method: (tree, predicted tokens/step, vector description)} for one budget."""
    from redwood.plan.planner import optimal_tree

    seq = inputs.vector(temperature, top_p, "sequoia")
    spec = inputs.vector(temperature, top_p, "specinfer")
    sequoia_tree = optimal_tree(seq.p, budget, max(1, min(budget, max_depth)))
    spec_tree = best_specinfer(spec.p, budget)
    chain_tree = chain(budget)
    return {"sequoia": (sequoia_tree, sequoia_tree.expected_length(seq.p), seq.describe()),
            "specinfer": (spec_tree, spec_tree.expected_length(spec.p), spec.describe()),
            "chain": (chain_tree, chain_tree.expected_length(seq.p), seq.describe())}


def run_scaling(config, pair, inputs, progress: bool = True) -> dict:
    """Measure tokens per target forward for every (temperature, budget, method)."""
    from redwood.prompts import humaneval_prompts

    config.check()
    started = time.perf_counter()
    top_p = max(config.top_ps)
    budgets = budgets_up_to(config.max_budget)
    eval_ids = pair.encode(humaneval_prompts("evaluation", limit=config.prompts))
    factory = MethodFactory(pair, inputs, [], [], [], 1, config.seed)
    plans = {(t, n): scaling_trees(inputs, t, top_p, n, config.max_depth)
             for t in config.temperatures for n in budgets}
    pooled = {key + (m,): [0, 0] for key in plans for m in SCALING_METHODS}   # tokens, forwards
    for i, ids in enumerate(eval_ids):
        for (t, n), trees in plans.items():
            if n == 1:
                continue
            for method in SCALING_METHODS:
                engine = factory.engine(trees[method][0])
                result = engine.generate(ids, config.max_new_tokens, temperature=t, top_p=top_p,
                                         seed=config.seed + i, method=method, stop_on_eos=False)
                steps = result.accepted[:-1] or result.accepted    # last step: cut to the limit
                pooled[(t, n, method)][0] += sum(steps)
                pooled[(t, n, method)][1] += len(steps)
        if progress:
            print(f"bench --scaling: prompt {i + 1}/{len(eval_ids)} done "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    rows = []
    for (t, n), trees in plans.items():
        for method in SCALING_METHODS:
            tree, predicted, vector = trees[method]
            tokens, forwards = pooled[(t, n, method)]
            rows.append({"temperature": t, "top_p": top_p, "budget": n, "method": method,
                         "nodes": len(tree), "levels": tree.num_levels, "parents": tree.parents,
                         "tokens_per_step": tokens / forwards if forwards else 1.0,
                         "measured": n > 1, "predicted_tokens_per_step": predicted,
                         "acceptance_vector": vector})
    return {"rows": rows, "elapsed_seconds": time.perf_counter() - started,
            "budgets": budgets, "prompts": len(eval_ids)}


def scaling_goal_lines(rows) -> list[str]:
    """Does sequoia gain at least as much per step as specinfer and the chain at n >= 8?"""
    lines = []
    for t in sorted({r["temperature"] for r in rows}):
        here = {(r["budget"], r["method"]): r["tokens_per_step"] for r in rows
                if r["temperature"] == t}
        gaps = []
        for n in sorted({b for b, _ in here if b >= 8}):
            seq = here[(n, "sequoia")]
            gaps.append((n, seq - here[(n, "specinfer")], seq - here[(n, "chain")]))
        if gaps:
            ok = all(a >= 0 and b >= 0 for _, a, b in gaps)
            detail = ", ".join(f"n={n}: {a:+.2f} / {b:+.2f}" for n, a, b in gaps)
            lines.append(f"- T={t:g}: sequoia minus specinfer / minus chain tokens per step: "
                         f"{detail} -> {'met' if ok else 'not met'}")
    return lines


def write_scaling(report: dict, config, pair, out_dir=None, date=None) -> dict[str, Path]:
    out = Path(out_dir or config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = (f"{config.machine or machine_name()}-{date or datetime.date.today().isoformat()}"
            "-scaling")
    document = {"format": 1, "kind": "bench-scaling", "stem": stem, "command": config.command,
                "models": pair.name, "prompts": report["prompts"],
                "max_new_tokens": config.max_new_tokens, "budgets": report["budgets"],
                "elapsed_seconds": report["elapsed_seconds"], "rows": report["rows"]}
    paths = {"summary": out / f"{stem}.json", "markdown": out / f"{stem}.md"}
    if config.plots:
        paths["plot"] = _plot(report["rows"], out / f"{stem}.png")
        document["plot"] = paths["plot"].name
    atomic_write(paths["summary"], json.dumps(document, indent=1))
    atomic_write(paths["markdown"], scaling_markdown(document))
    return paths


def scaling_markdown(doc: dict) -> str:
    lines = [f"# redwood bench --scaling: {doc['stem']}", "",
             f"- command: `{doc['command']}`" if doc.get("command") else "- command: (API call)",
             f"- models: {doc['models']}; {doc['prompts']} evaluation prompts x "
             f"{doc['max_new_tokens']} new tokens, EOS ignored",
             f"- wall time: {duration(doc['elapsed_seconds'])} (model loading excluded)", "",
             "Tokens per target forward (measured / planner-predicted):", "",
             "| T | budget | sequoia | specinfer (k x d) | chain |", "|---|---|---|---|---|"]
    rows = doc["rows"]
    for t in sorted({r["temperature"] for r in rows}):
        for n in doc["budgets"]:
            cells = []
            for method in SCALING_METHODS:
                r = next(r for r in rows if r["temperature"] == t and r["budget"] == n
                         and r["method"] == method)
                shape = f" ({_shape(r)})" if method == "specinfer" and n > 1 else ""
                cells.append(f"{r['tokens_per_step']:.2f} / {r['predicted_tokens_per_step']:.2f}"
                             f"{shape}")
            lines.append(f"| {t:g} | {n} | " + " | ".join(cells) + " |")
    goals = scaling_goal_lines(rows)
    if goals:
        lines += ["", "Goal (issue 4): sequoia >= specinfer and chain at every budget >= 8:", ""]
        lines += goals
    lines += ["", "n = 1 is plain decoding (1 token per forward by definition, not run). "
              "Each generation's last step (cut to the token limit) is left out.",
              "Predictions use the positional model with the acceptance vector of each row "
              "(sequoia vector for sequoia and chain, specinfer vector for specinfer)."]
    if doc.get("plot"):
        lines += ["", f"![scaling]({doc['plot']})"]
    return "\n".join(lines) + "\n"


def _shape(row) -> str:
    tree = Tree(row["parents"])
    return f"{len(tree.children[0])}x{tree.num_levels - 1}"


def _plot(rows, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(temps), figsize=(4.2 * len(temps), 3.8), squeeze=False)
    for ax, t in zip(axes[0], temps):
        # sequoia drawn last (on top) and largest: the three coincide for small budgets
        for method, color, marker, size in (("chain", "tab:blue", "s", 4),
                                            ("specinfer", "tab:orange", "^", 5),
                                            ("sequoia", "tab:green", "o", 7)):
            mine = sorted((r for r in rows if r["temperature"] == t and r["method"] == method),
                          key=lambda r: r["budget"])
            xs = [r["budget"] for r in mine]
            ax.plot(xs, [r["tokens_per_step"] for r in mine], marker=marker, markersize=size,
                    color=color, markerfacecolor="none", label=f"{method} measured")
            ax.plot(xs, [r["predicted_tokens_per_step"] for r in mine], linestyle="--",
                    color=color, label=f"{method} predicted")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tree budget n (nodes incl. root)")
        ax.set_title(f"T = {t:g}")
    axes[0][0].set_ylabel("tokens per target forward")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
