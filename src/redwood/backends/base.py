"""The `Backend` protocol: the smallest interface the decode loop needs from a model runtime.

A backend holds one sequence: a *committed* prefix of `cache_length()` tokens at positions
0..L-1, plus the *tentative* tree nodes run since the last `keep_path` (see docs/design.md,
"Backends"). Every call below is all the loop, the drafters, `calibrate` and `profile` use.

    backend.reset()                                  # empty cache
    logits = backend.append(ids, rows=1)             # commit ids (causal); logits of the last row
    logits = backend.run_tree(tree, nodes, tokens, root_position)   # tentative tree nodes
    logits = backend.prefill_tree(ids, tree, tokens) # commit ids, then the whole tree tentative
    backend.keep_path(nodes_on_path)                 # commit those, drop every other tentative node

Tree nodes are indices into a `Tree` (BFS order, node 0 = the root). Node u sits at position
root_position + depth(u) and attends to the committed prefix, then to its own ancestors among
the tentative nodes and itself. The root is either run as a tree node (the target's verify:
`nodes` starts with 0 and root_position == cache_length()) or already committed at
root_position == cache_length() - 1 (the draft: it commits the root with `append` before
drafting level by level). Successive `run_tree` calls in one step add nodes below those run
earlier; descendants see the ancestors run before them. `prefill_tree` is `append(ids, rows=0)`
followed by a verify-style `run_tree` of the whole tree, in one forward where the runtime
allows (the engine's first step: the prompt and the first tree, docs/design.md §5.4).

Logits are float32 torch tensors [rows, V] on `device`; V = `vocab_size` (the width of the
logits, which may exceed the tokenizer's vocabulary).
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from redwood.plan.tree import Tree


@runtime_checkable
class Backend(Protocol):
    name: str                   # a human name for messages (the model path)
    device: torch.device        # where logits live
    vocab_size: int             # width of the logits
    max_positions: int | None   # the context limit (positions), None = unknown
    eos_ids: frozenset[int]     # tokens that end a generation
    dtype_name: str             # weights / compute type, for profiles ("float32", "Q4_K_M", ...)
    fused_prefill_tree: bool    # prefill_tree runs in one forward (else the engine prefills
                                # the whole prompt and takes the first token from it)

    def reset(self) -> None:
        """Drop the whole cache (committed and tentative)."""

    def cache_length(self) -> int:
        """Committed tokens in the cache."""

    def append(self, ids: Sequence[int] | torch.Tensor, rows: int = 1) -> torch.Tensor:
        """Run `ids` causally after the committed prefix and commit them (no tentative nodes
        may be pending). Returns logits of the last `rows` tokens [rows, V] (rows 0 = none:
        an empty tensor)."""

    def run_tree(self, tree: Tree, nodes: Sequence[int], tokens: torch.Tensor,
                 root_position: int, rows: Sequence[int] | None = None) -> torch.Tensor:
        """Run tree `nodes` (BFS order; each node's parent is the root, in `nodes`, or run
        earlier this step) with token ids `tokens` [len(nodes)] as tentative nodes.
        rows: which of `nodes` (indices into `nodes`) need logits; None = all.
        Returns logits [len(rows), V]."""

    def prefill_tree(self, ids: Sequence[int] | torch.Tensor, tree: Tree,
                     tokens: torch.Tensor) -> torch.Tensor:
        """Commit `ids` causally after the committed prefix (like append(ids, rows=0)) and run
        every node of `tree` (token ids `tokens` [len(tree)], node 0 the root at position
        cache_length() + len(ids)) as tentative nodes right after them, in one forward where
        the runtime allows; no tentative nodes may be pending. Afterwards cache_length() has
        grown by len(ids) and keep_path proceeds as after run_tree. Empty `ids` = run_tree of
        the whole tree. Returns logits of the tree nodes [len(tree), V]."""

    def keep_path(self, nodes: Sequence[int]) -> None:
        """Commit the tentative nodes `nodes` (a chain, each the child of the previous, the
        first a child of the last committed token or the tentative root) and drop every other
        tentative node. An empty list drops all tentative nodes."""

    def room_needed(self, tree: Tree) -> int:
        """Context room one step of `tree` takes beyond the committed tokens: its depth where
        the limit is on positions (transformers), its node count where every tentative node
        takes a cache cell (llama.cpp)."""

    def check_tree(self, tree: Tree) -> None:
        """Raise RedwoodError if this backend cannot run `tree` in one call (limits of the
        runtime); called before any native call that could abort the process."""


def tree_limits_error(tree: Tree, max_nodes: int | None, max_leaves: int | None,
                      backend: str) -> str | None:
    """The message for a tree beyond a runtime's per-call limits, or None if it fits."""
    leaves = sum(1 for kids in tree.children if not kids)
    if max_nodes is not None and len(tree) > max_nodes:
        return (f"the tree has {len(tree)} nodes but the {backend} backend runs at most "
                f"{max_nodes} per forward; plan a smaller tree (--budget) or raise its batch size")
    if max_leaves is not None and leaves > max_leaves:
        return (f"the tree has {leaves} leaves but the {backend} backend holds at most "
                f"{max_leaves} sequences; plan a narrower tree or raise its sequence limit")
    return None
