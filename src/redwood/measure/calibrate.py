"""`redwood calibrate`: measure the acceptance vector p of a (target, draft, sampling, method)
on-policy.

Each decoding step drafts a *star*: `width` children of the current root, drawn by the
method's rule (sequoia: without replacement; specinfer: i.i.d.; temperature 0: the draft's
top-k), verifies it with the real verification function in one target forward, records the
rank of the accepted child (or none), and advances with the real outcome (the accepted child
and the bonus token, or the bonus alone), exactly as the engine would with a star tree.
p_k = (steps whose rank-k child was accepted) / steps: the unconditional vector of docs/design.md §2.1.

It also records acceptance by draft confidence (plan.formats.ConfidenceBins): every child the
verifier examined (ranks 1..the accepted one, or all when none was accepted; later ranks are
never looked at) is binned by the draft's probability for it, as the adaptive drafter
measures it (ChildChooser.confidence: the sampling law, or the raw softmax when greedy), and
counted as accepted or not. That is the evidence for a draft-confidence threshold (§4.6):
how much a token of a given confidence is worth.

The loop is the engine's step reduced to a star (the Backend protocol, DraftModelDrafter, the
verify functions), so what is measured is what the engine does.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from redwood.decode.draft_model import DraftModelDrafter
from redwood.decode.drafter import ChildChooser
from redwood.decode.request import as_backend, check_same_vocab
from redwood.decode.layout import TreeLayout
from redwood.decode.params import SamplingParams
from redwood.errors import RedwoodError
from redwood.plan.formats import Acceptance, ConfidenceBins
from redwood.plan.tree import star

METHODS = ("sequoia", "specinfer")


class _ConfidenceChooser(ChildChooser):
    """The request's chooser, keeping the draft's probability of each child it picks (the
    adaptive drafter's confidence, computed by the same function)."""

    last: tuple[float, ...] = ()

    def __call__(self, logits: torch.Tensor, k: int, law: torch.Tensor | None = None):
        children, probs = super().__call__(logits, k, law)
        self.last = tuple(self.confidence(logits, probs, children)[0].tolist())   # root row
        return children, probs


class _StarStep:
    """One calibration step: draft a star under the root, verify, advance both caches."""

    def __init__(self, target, params: SamplingParams, width: int, method: str,
                 generator: torch.Generator):
        self.target = target                                 # Backend
        self.tree = star(width)
        self.params = params
        self.chooser = _ConfidenceChooser.for_request(params, method, generator)
        self.bins = ConfidenceBins.empty()
        self.generator = generator
        self.layout = TreeLayout.build(self.tree, target.device)   # ancestor [W+1, W+1], depths [W+1]

    def __call__(self, root: int, drafter) -> tuple[int, list[int]]:
        """-> (rank of the accepted child, 0 if none; the step's new tokens)."""
        from redwood.decode.sampling import process_logits
        from redwood.decode.verify import verify_greedy, verify_tree

        proposal = drafter.propose(root, self.layout, self.chooser)
        logits = self.target.run_tree(self.tree, range(len(self.tree)), proposal.tokens,
                                      self.target.cache_length())               # [W+1, V]
        p = self.params
        if p.greedy:
            path, bonus = verify_greedy(logits.argmax(dim=-1), proposal.tokens, self.tree)
        else:
            probs = process_logits(logits, p.temperature, p.top_k, p.top_p)
            path, bonus = verify_tree(probs, proposal.draft_probs, proposal.tokens, self.tree,
                                      self.chooser.replacement, self.generator)
        self.target.keep_path(path)
        drafter.commit(path, proposal.tokens)
        # In a star node i is the root's i-th child: its index is its rank.
        rank = path[1] if len(path) > 1 else 0
        for i in range(1, (rank or len(self.tree) - 1) + 1):        # the children examined
            self.bins.add(self.chooser.last[i - 1], accepted=i == rank)
        return rank, [int(proposal.tokens[u]) for u in path[1:]] + [int(bonus)]


def calibrate(target, draft, prompts: list, temperature: float, top_p: float = 1.0,
              top_k: int = 0, method: str = "sequoia", width: int = 16,
              max_new_tokens: int = 64, seed: int = 0, progress: bool = True,
              stop_on_eos: bool = True, dataset: str = "", target_name: str | None = None,
              draft_name: str | None = None) -> Acceptance:
    """Measure p_1..p_width on `prompts` (a list of 1-D token id tensors), generating up to
    `max_new_tokens` per prompt (stopping at EOS when `stop_on_eos`). target, draft:
    transformers models or Backends.

    The result's extra fields: "counts" (steps accepted at each rank), "rejected" (steps that
    accepted no child), "confidence_bins" (ConfidenceBins.to_dict: acceptance of the examined
    children by the draft's probability for them), "method", "width", "tokens", "prompts",
    "seconds".
    """
    target, draft = as_backend(target), as_backend(draft)
    check_same_vocab(target, draft)
    params = SamplingParams(max_new_tokens, temperature, top_p, top_k, seed)
    if method not in METHODS:
        raise RedwoodError(f"calibration method must be one of {', '.join(METHODS)} "
                           f"(chain is sequoia with width 1), got {method!r}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise RedwoodError(f"width must be an integer >= 1, got {width!r}")
    star_tree = star(width)
    target.check_tree(star_tree)
    draft.check_tree(star_tree)
    prompts = _check_prompts(prompts, target, max_new_tokens)
    generator = torch.Generator(device=target.device).manual_seed(seed)
    step = _StarStep(target, params, width, method, generator)
    eos = set(target.eos_ids) if stop_on_eos else set()
    counts = np.zeros(width + 1, dtype=np.int64)       # counts[0]: no child accepted
    tokens_made = 0
    start = time.perf_counter()
    bar = _progress_bar(len(prompts) * max_new_tokens, progress)
    drafter = DraftModelDrafter(draft, time.perf_counter)
    with torch.inference_mode():
        for prompt in prompts:
            made = _run_prompt(prompt.to(target.device), target, drafter, step, max_new_tokens,
                               eos, counts, bar)
            tokens_made += made
    bar.close()
    steps = int(counts.sum())
    return Acceptance(
        p=counts[1:] / steps, temperature=float(temperature), top_p=float(top_p),
        top_k=top_k or None, draft=draft_name or draft.name,
        target=target_name or target.name, dataset=dataset, steps=steps,
        extra={"method": method, "width": width, "counts": counts[1:].tolist(),
               "rejected": int(counts[0]), "confidence_bins": step.bins.to_dict(),
               "prompts": len(prompts), "tokens": tokens_made,
               "max_new_tokens": max_new_tokens, "seed": seed,
               "seconds": round(time.perf_counter() - start, 3)})


def _run_prompt(prompt, target, drafter, step, max_new_tokens, eos, counts, bar) -> int:
    """Decode one prompt with star steps, adding each step's accepted rank to `counts`.
    Returns the number of new tokens. Cache invariant as in the engine: the target cache
    holds every token but the current root."""
    target.reset()
    target.append(prompt[:-1], rows=0)
    drafter.prefill(prompt[:-1])
    root, made = int(prompt[-1]), 0
    while made < max_new_tokens:
        rank, new_tokens = step(root, drafter)
        counts[rank] += 1
        new_tokens = new_tokens[: max_new_tokens - made]
        made += len(new_tokens)
        bar.update(len(new_tokens))
        if any(t in eos for t in new_tokens):
            break
        root = new_tokens[-1]
    return made


def _check_prompts(prompts, target, max_new_tokens) -> list[torch.Tensor]:
    if not prompts:
        raise RedwoodError("calibration needs at least one prompt")
    vocab = target.vocab_size
    limit = target.max_positions
    out = []
    for i, ids in enumerate(prompts):
        ids = torch.as_tensor(ids)
        if ids.dim() != 1 or ids.numel() == 0 or ids.dtype not in (torch.int64, torch.int32):
            raise RedwoodError(f"prompt {i} must be a non-empty 1-D tensor of token ids")
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise RedwoodError(f"prompt {i} has token ids outside [0, {vocab})")
        if limit and ids.numel() + max_new_tokens + 2 > limit:
            raise RedwoodError(f"prompt {i} ({ids.numel()} tokens) + max_new_tokens "
                               f"({max_new_tokens}) exceeds the model's {limit} positions")
        out.append(ids.long())
    return out


def _progress_bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="calibrate", unit="tok", disable=not enabled, leave=False)


def calibration_prompts(tokenizer, source: str = "humaneval", count: int | None = None,
                        chat: bool = False) -> tuple[list[torch.Tensor], str]:
    """Token ids of calibration prompts and a dataset label. source: "humaneval" (the
    calibration split, disjoint from the evaluation split bench uses), "chat" (the chat set's
    calibration split, one user message each in the chat template: redwood.chat_prompts) or a
    JSONL file of {"prompt": ...} lines. count: use only the first `count` prompts."""
    from redwood.prompts import encode_prompt, humaneval_prompts, read_prompt_file

    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise RedwoodError(f"number of prompts must be an integer >= 1, got {count!r}")
    if source == "humaneval":
        texts = humaneval_prompts("calibration")
        label = "humaneval calibration split (problems 0-39)"
    elif source == "chat":
        from redwood.chat_prompts import CALIBRATION_FROM, CHAT_PROMPTS, chat_calibration_prompts
        from redwood.prompts import has_chat_template

        texts, chat = chat_calibration_prompts(), has_chat_template(tokenizer)
        label = (f"chat calibration split (chat-{CALIBRATION_FROM}..chat-{len(CHAT_PROMPTS) - 1}"
                 f"{', chat template' if chat else ', raw text'})")
    else:
        texts = read_prompt_file(source)
        label = str(source)
    texts = texts[:count] if count else texts
    label += f", first {len(texts)} prompts"
    return [encode_prompt(tokenizer, text, chat) for text in texts], label
