"""Checking a request before anything runs, and the small conversions the engine makes
(models to backends, a method's tree, a drafter's parts)."""
from __future__ import annotations

import torch

from redwood.decode.params import SamplingParams, check_draft_confidence
from redwood.decode.stream import DecodeOptions
from redwood.errors import RedwoodError
from redwood.plan.tree import Tree

METHODS = ("autoregressive", "chain", "specinfer", "sequoia")


def check_request(input_ids, params: SamplingParams, options: DecodeOptions, target,
                  draft=None, max_positions: int | None = None) -> torch.Tensor:
    """The prompt as a 1-D long tensor, once every part of the request is valid for these
    backends (target, draft: Backends; draft None for free drafters); RedwoodError naming the
    problem otherwise, before any native call could abort the process."""
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.dtype not in (torch.int64, torch.int32):
        raise RedwoodError(f"input_ids must be a 1-D or [1, L] integer tensor, got shape "
                           f"{tuple(ids.shape)} and dtype {ids.dtype}")
    if ids.numel() == 0:
        raise RedwoodError("the prompt is empty: give at least one token")
    check_draft_confidence(options.draft_confidence)
    if options.method not in METHODS:
        raise RedwoodError(f"unknown method {options.method!r}; choose one of {', '.join(METHODS)}")
    vocab = target.vocab_size
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise RedwoodError(f"prompt token ids must lie in [0, {vocab}), got {int(ids.min())}..{int(ids.max())}")
    tree = options.tree
    if not isinstance(tree, Tree):
        raise RedwoodError(f"tree must be a redwood.Tree, got {type(tree).__name__}")
    if options.method != "autoregressive":
        for backend in (target, draft):
            if backend is not None:
                backend.check_tree(method_tree(options.method, tree))
    run = method_tree(options.method, tree) if options.method != "autoregressive" else Tree([-1])
    room = max(b.room_needed(run) for b in (target, draft) if b is not None)
    needed = ids.numel() + params.max_new_tokens + room
    if max_positions is not None and needed > max_positions:
        raise RedwoodError(
            f"prompt ({ids.numel()} tokens) + max_new_tokens ({params.max_new_tokens}) + one "
            f"tree step ({room}) = {needed} exceeds the model context of "
            f"{max_positions} positions; shorten the prompt or lower max_new_tokens")
    return ids.long()


def as_backend(model_or_backend):
    """A Backend as is; a transformers model wrapped in the transformers backend."""
    if hasattr(model_or_backend, "run_tree") and hasattr(model_or_backend, "keep_path"):
        return model_or_backend
    from redwood.backends.hf import HFBackend

    return HFBackend(model_or_backend)


def check_same_vocab(target, draft) -> int:
    """The shared logits width of two backends; RedwoodError naming both if they differ.
    Speculative decoding compares the two distributions token by token."""
    if target.vocab_size != draft.vocab_size:
        raise RedwoodError(
            f"vocabularies differ: target {target.name} has {target.vocab_size} tokens, draft "
            f"{draft.name} has {draft.vocab_size}; pick a draft that shares the target's tokenizer")
    return target.vocab_size


def drafter_parts(drafter) -> list:
    """The drafter and the parts a hybrid drafter is made of (its `model` and `ngram`)."""
    parts = (drafter, getattr(drafter, "model", None), getattr(drafter, "ngram", None))
    return [part for part in parts if part is not None]


def set_for_request(drafter, name: str, value) -> None:
    """Set a request's setting on the drafter and its parts, wherever that attribute exists."""
    for part in drafter_parts(drafter):
        if hasattr(part, name):
            setattr(part, name, value)


def finish_drafters(drafter) -> None:
    """The request ended: drafters that keep something across requests (the n-gram memory)
    store it now (an abandoned stream is stored at the next prefill instead)."""
    for part in drafter_parts(drafter):
        if hasattr(part, "finish"):
            part.finish()


def method_tree(method: str, tree: Tree) -> Tree:
    """The tree a method runs (chain: one child per level, as deep as the tree)."""
    if method == "chain":
        return Tree(list(range(-1, tree.num_levels - 1)), {"kind": "chain"})
    return tree


def as_tree(tree) -> Tree:
    if tree is None:
        from redwood.plan.tree import default_tree

        return default_tree()
    if isinstance(tree, Tree):
        return tree
    return Tree.load(tree)


def ngram_part(drafter):
    """The n-gram drafter itself or a hybrid's n-gram part (the part keeping `match_counts`),
    None for drafters without one."""
    return next((part for part in drafter_parts(drafter)
                 if isinstance(getattr(part, "match_counts", None), dict)), None)


def draft_ratio(drafter) -> float | None:
    """The n-gram drafter's draft ratio, None without an n-gram drafter."""
    part = ngram_part(drafter)
    return part.draft_ratio() if part is not None else None


def match_counts(drafter) -> dict:
    """The n-gram drafter's live counts of this request's proposals by match length, {} for
    drafters without them."""
    part = ngram_part(drafter)
    return part.match_counts if part is not None else {}
