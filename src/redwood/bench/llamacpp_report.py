"""The llama.cpp bench's document parts (`redwood bench --backend llamacpp`): its results table,
whose primary column is the end-to-end time per request with ratios to plain llama.cpp, its
summary lines and its notes. The rows come from bench.report.summarize."""
from __future__ import annotations

from redwood.bench.common import METHOD_LABELS

REDWOOD = ("autoregressive", "chain", "specinfer", "sequoia", "sequoia_fixed", "sequoia_adaptive",
           "sequoia_governed", "sequoia_grown", "ngram", "hybrid")


def _fmt(value, pattern="{:.2f}", missing="–") -> str:
    return missing if value is None else pattern.format(value)


def _yes(value) -> str:
    return "–" if value is None else ("yes" if value else "no")


def caption(doc: dict) -> str:
    config = doc["config"]
    return (f"{doc['runtime']}. Primary figure: end-to-end wall time per request, prefill "
            f"included (median over {config['prompts']} prompts x {config['max_new_tokens']} new "
            "tokens). × plain = plain llama.cpp's time / the method's on the same prompt (> 1 is "
            "faster): median, and the worst prompt. Decode tokens/s, the time split and "
            "other / decode (time outside the model forwards over decode time: the engine's "
            "overhead) exclude prefill. By source: tokens per target forward made by the target "
            "itself (one per forward) and accepted from each drafter (model or n-gram), pooled; "
            "for governed methods also the share of steps the governor ran plain.")


def results_table(rows) -> list[str]:
    lines = ["| method | config | T | top_p | end-to-end s | × plain (median) | × plain (worst) | "
             "prefill s | decode tokens/s | tokens/step | by source | predicted | "
             "time % target / draft / other | other / decode | greedy = plain | greedy = AR |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["time_split"]
        split = f"{100 * s['target']:.0f} / {100 * s['draft']:.0f} / {100 * s['other']:.0f}"
        lines.append(
            f"| {METHOD_LABELS.get(r['method'], r['method'])} | {r['config']} | "
            f"{r['temperature']:g} | {r['top_p']:g} | {_fmt(r['end_to_end_seconds'], '{:.3f}')} | "
            f"{_fmt(r['speedup_vs_plain_llamacpp'])} | "
            f"{_fmt(r['speedup_vs_plain_llamacpp_min'])} | {r['prefill_seconds']:.3f} | "
            f"{r['tokens_per_second']:.2f} | {r['tokens_per_step']:.2f} | {by_source(r)} | "
            f"{_fmt(r['predicted_tokens_per_step'])} | {split} | "
            f"{100 * r['overhead_share']:.1f}% | {_yes(r.get('greedy_matches_plain_llamacpp'))} | "
            f"{_yes(r['greedy_matches_autoregressive'])} |")
    return lines


def by_source(row) -> str:
    """'1.00 target + 1.31 ngram; 20% steps plain' from a summary row."""
    split = row.get("tokens_per_step_by_source") or {}
    text = " + ".join(f"{value:.2f} {name}" for name, value in split.items()) or "–"
    if row.get("governor_plain_share") is not None:
        text += f"; {100 * row['governor_plain_share']:.0f}% steps plain"
    return text


def goal_lines(rows) -> list[str]:
    """Per setting: the fastest redwood method and the tuned / fixed trees and prompt lookup
    against plain llama.cpp, end to end."""
    lines = []
    for t, p in sorted({(r["temperature"], r["top_p"]) for r in rows}):
        here = {r["method"]: r for r in rows if r["temperature"] == t and r["top_p"] == p}
        if "llamacpp_plain" not in here:
            continue
        parts = []
        ours = [r for m, r in here.items() if m in REDWOOD
                and r["speedup_vs_plain_llamacpp"] is not None]
        if ours:
            best = max(ours, key=lambda r: r["speedup_vs_plain_llamacpp"])
            parts.append(f"fastest redwood method {best['method']} ({best['config']}) "
                         f"{_ratio(best)} plain llama.cpp end to end")
        if "autoregressive" in here:
            parts.append(f"redwood autoregressive {_ratio(here['autoregressive'])} (engine "
                         f"overhead {100 * here['autoregressive']['overhead_share']:.1f}% of "
                         "decode)")
        for method, what in (("sequoia", "tuned sequoia"), ("sequoia_fixed", "fixed tree")):
            r = here.get(method)
            if r is None:
                continue
            text = f"{what} {r['config']} {_ratio(r)}"
            if (r.get("tree_parents") or [None]) == [-1]:
                text += " (budget 1: the planner declined to speculate)"
            elif r["predicted_tokens_per_step"]:
                error = r["tokens_per_step"] / r["predicted_tokens_per_step"] - 1
                text += (f", tokens/step {r['tokens_per_step']:.2f} vs predicted "
                         f"{r['predicted_tokens_per_step']:.2f} ({100 * error:+.0f}%)")
            parts.append(text)
        for method, what in (("sequoia_governed", "governed sequoia (generate's default)"),
                             ("ngram", "n-gram drafter (governed)"),
                             ("hybrid", "hybrid drafter (governed)")):
            r = here.get(method)
            if r is not None:
                parts.append(f"{what} {_ratio(r)}, {r['tokens_per_step']:.2f} tokens/step "
                             f"({by_source(r)})")
        for method, what in (("llamacpp_prompt_lookup", "llama.cpp prompt lookup"),
                             ("llamacpp_prompt_lookup_best",
                              "llama.cpp prompt lookup at its best")):
            r = here.get(method)
            if r is not None:
                parts.append(f"{what} ({r['config']}) {_ratio(r)}, {r['tokens_per_step']:.2f} "
                             "tokens/step")
        lines.append(f"- **T={t:g}, top_p={p:g}**: " + "; ".join(parts))
    return lines


def _ratio(row) -> str:
    return (f"{_fmt(row['speedup_vs_plain_llamacpp'])}x (worst prompt "
            f"{_fmt(row['speedup_vs_plain_llamacpp_min'])}x)")


def notes(config) -> list[str]:
    out = [
        "primary figure: end-to-end wall time of each request, prefill included, for every "
        "method (docs/design.md §9): redwood methods time the whole Engine.generate call (prefill "
        "of the target, and of the draft when it drafts, then decoding); llama-cpp-python's "
        "Llama times generate from the prompt's token ids to the N-th new token; tokenisation "
        "is outside every timing (every method gets the same token ids)",
        "plain llama.cpp and prompt lookup: llama-cpp-python's high-level Llama on the target "
        "GGUF with the same n_ctx and n_threads = n_threads_batch as redwood's backend, "
        "verbose=False, flash_attn=True (redwood's backend context uses llama.cpp's default "
        "flash_attn 'auto', which resolves to enabled on the CPU; Llama's own default, False, "
        "would run a different attention kernel than redwood, against §9); Llama.reset() "
        "before each request, so no prefix cached by the previous request is reused",
        "prompt lookup: Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10)), "
        "llama-cpp-python's default; with a draft model Llama keeps every token's logits "
        "(logits_all), so its prefill also computes the output head for every prompt token",
        "exactly max_new_tokens tokens for every method, EOS ignored: Llama.generate (an "
        "endless generator: only create_completion stops at EOS) is stopped after N tokens, "
        "redwood runs with stop_on_eos=False; EOS is neither stopped at nor suppressed",
        "decode-only (secondary): tokens made after the prefill / time after the prefill. "
        "Llama and redwood's plain decoding (autoregressive, or a tree of one node) evaluate "
        "the whole prompt and take the first token from its last row: (M - 1) tokens; "
        "redwood's speculative methods prefill all but the last prompt token, which their "
        "first step runs as the root: M tokens",
        "tokens/step = new tokens / target forwards (pooled over prompts); for Llama the "
        "forwards are its evaluations, the prompt's included; predicted = the tree's expected "
        "length under the acceptance vector (positional model)",
        "time split of decode: target = target forwards (redwood: the backend's append / "
        "run_tree, i.e. llama_decode plus reading the logits; Llama: Llama.eval), draft = draft "
        "forwards (prompt lookup: its n-gram proposals), other = the rest (sampling, "
        "verification, Python); other / decode is the share of decode time outside the model "
        "forwards",
        "greedy = AR: token-for-token equal to redwood's autoregressive on the same backend; "
        "greedy = plain: equal to Llama.generate. llama.cpp's kernels differ by batch size "
        "(docs/design.md §5.3), so a speculative method, which verifies several tokens per "
        "forward, may break a near-tie the other way on a real model: a 'no' there is a fork "
        "at a near-tie, not a verification error (the tiny-model tests check exact equality)",
        "prompt sets (one table each): humaneval = raw completion prompts of HumanEval's "
        "evaluation split; whole_file / mixed / low_copy = the input-grounded edit tasks of "
        "redwood.edit_tasks (a whole module with one function renamed / type hints and a "
        "docstring added / every variable renamed), each one user message in the tokenizer's "
        "chat template (raw text where the tokenizer has none: see below)",
        "sequoia_governed: what `redwood generate` runs by default: the tuned bundle's acceptance "
        "vectors re-planned for this machine's first-use profile (adaptive where the bundle "
        "has adaptive trees), each request governed by that profile (it drafts only while "
        "drafting pays on that request); sequoia is the bundle's own tree, ungoverned",
        "ngram: redwood's n-gram (prompt-lookup) drafter alone, point-mass proposals verified "
        "exactly, each step's tree sized by its cost model on this machine's t(n), governed "
        "by the same profile; a fresh drafter per request (its acceptance model starts from "
        "its priors each time)",
        "llamacpp_prompt_lookup_best: llama-cpp-python's prompt lookup at the num_pred_tokens "
        f"of the grid {{{', '.join(map(str, config.lookup_grid))}}} with the shortest "
        "end-to-end time on the FIRST prompt of each prompt set (at each setting; that prompt "
        "is also measured, which favours this method slightly), then run on every prompt of "
        "the set; llamacpp_prompt_lookup is its default, num_pred_tokens=10",
        "by source: the target makes one token per forward (the bonus, or the token of a plain "
        "step); the tokens beyond that were drafted and accepted, credited to their source "
        "(model: the draft model; ngram: redwood's n-gram drafter or llama-cpp-python's "
        "prompt lookup); for Llama the forwards include the prompt's evaluation",
        "ratios are medians over prompts of per-prompt ratios, with the worst prompt; methods "
        "interleaved per prompt in a rotating order; greedy (T = 0) ignores top_p and runs "
        "once, at the largest top_p",
    ]
    if any(p < 1.0 for p in config.top_ps) and any(t not in (0.0, 1.0) for t in config.temperatures):
        out.append("top_p < 1 with T not in {0, 1}: llama.cpp's sampler applies top-p to the "
                   "untempered distribution, before temperature, where redwood applies "
                   "temperature first, so the llama.cpp baselines sample another distribution "
                   "there")
    return out
