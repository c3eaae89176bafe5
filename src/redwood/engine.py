"""The speculative decoding engine: draft a tree, verify it in one target forward,
keep the accepted path, repeat.

    engine = Engine(target, draft, tree)
    result = engine.generate(input_ids, max_new_tokens=64, temperature=0.0)

Cache invariant between steps: the target cache holds every token except the
current root (the newest token); each step runs the root plus the tree's nodes.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from redwood import kvcache
from redwood.drafter import ChildChooser, DraftModelDrafter
from redwood.errors import RedwoodError
from redwood.layout import TreeLayout
from redwood.stats import GenerationResult, StepStats
from redwood.tree import Tree

METHODS = ("autoregressive", "chain", "specinfer", "sequoia")


@dataclass
class Request:
    """One validated generation request."""
    input_ids: torch.Tensor            # [L] long
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    method: str = "sequoia"
    stop_on_eos: bool = True
    tree: Tree | None = None
    draft_confidence: float = 0.0      # prune drafting below draft tokens less probable than this

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class DecodeState:
    """The live state of one generation (exposed on the Stream for inspection and tests)."""
    target_cache: object = None        # transformers DynamicCache of the target
    drafter: DraftModelDrafter | None = None
    prompt: torch.Tensor | None = None
    tokens: list[int] | None = None    # new tokens so far
    accepted: list[int] | None = None
    stats: StepStats | None = None
    prefill_seconds: float = 0.0
    method: str = ""


class Stream:
    """Iterate to receive the new tokens of each step (list[int]); `result` is set at the end."""

    def __init__(self, steps, state: DecodeState):
        self._steps = steps
        self.state = state
        self.result: GenerationResult | None = None

    def __iter__(self):
        while True:
            try:
                yield next(self._steps)
            except StopIteration as done:
                if done.value is not None:       # None after close(): keep its partial result
                    self.result = done.value
                return

    def close(self) -> None:
        """Stop early (e.g. the client went away). `result` then holds what was generated
        so far, with finish_reason "stopped"."""
        self._steps.close()
        state = self.state
        if self.result is None and state.tokens is not None:
            self.result = GenerationResult(list(state.tokens), list(state.accepted), state.stats,
                                           state.prefill_seconds, state.method, "stopped")


class Engine:
    def __init__(self, target_model, draft_model, tree: Tree | str | None = None,
                 draft_confidence: float = 0.0):
        """tree: the default tree for requests; draft_confidence: their default pruning
        threshold (see `stream`). Requests may override both."""
        from redwood.models import check_same_vocab

        check_same_vocab(target_model, draft_model)
        check_draft_confidence(draft_confidence)
        self.draft_confidence = float(draft_confidence)
        self.target = target_model.eval()
        self.draft = draft_model.eval()
        self.tree = _as_tree(tree)
        self.device = self.target.device
        self.eos_ids = _eos_ids(self.target)
        self.max_positions = _max_positions(self.target, self.draft)
        self._layouts: dict = {}

    # -- public API ---------------------------------------------------------------------
    def generate(self, input_ids, max_new_tokens: int, **options) -> GenerationResult:
        stream = self.stream(input_ids, max_new_tokens, **options)
        for _ in stream:
            pass
        return stream.result

    def stream(self, input_ids, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int | None = None, method: str = "sequoia",
               stop_on_eos: bool = True, tree: Tree | None = None,
               draft_confidence: float | None = None) -> Stream:
        """Generate lazily; `tree` overrides the engine's tree for this request only.

        draft_confidence in [0, 1): 0 drafts the whole tree every step; above 0 a node gets
        children only while the draft gave every token on its path a probability at or
        above this value, so the tree adapts to how predictable the text is (output stays exact).
        None = the engine's default.
        """
        if draft_confidence is None:
            draft_confidence = self.draft_confidence
        request = self._validate(input_ids, max_new_tokens, temperature, top_p, top_k, seed,
                                 method, stop_on_eos, tree if tree is not None else self.tree,
                                 draft_confidence)
        state = DecodeState()
        return Stream(self._run(request, state), state)

    # -- the loop -------------------------------------------------------------------------
    @torch.inference_mode()
    def _run(self, request: Request, state: DecodeState):
        generator = torch.Generator(device=self.device)
        generator.manual_seed(request.seed if request.seed is not None else torch.seed())
        layout = self._layout_of(self._method_tree(request.method, request.tree))
        tree = layout.tree
        speculative = request.method != "autoregressive" and len(tree) > 1
        stats = StepStats(accepted_at_depth=[0] * (tree.num_levels - 1 if speculative else 0))
        prompt = request.input_ids.to(self.device)

        # Prefill both models with every prompt token but the last, which becomes the
        # first root: so even the first new token comes from a verified step.
        start = self._clock()
        target_cache = kvcache.new_cache(self.target)
        if len(prompt) > 1:
            positions = torch.arange(len(prompt) - 1, device=self.device)
            kvcache.forward(self.target, prompt[:-1], positions, target_cache, rows=1)
        drafter = None
        if speculative:
            drafter = DraftModelDrafter(self.draft, self._clock)
            drafter.prefill(prompt[:-1])
            chooser = self._chooser(request, generator)
        prefill_seconds = self._clock() - start

        root, tokens, accepted, finish = int(prompt[-1]), [], [], None
        state.target_cache, state.drafter, state.prompt = target_cache, drafter, prompt
        state.tokens, state.accepted, state.stats = tokens, accepted, stats
        state.prefill_seconds, state.method = prefill_seconds, request.method
        while finish is None:
            step_start, forward_seconds = self._clock(), stats.target_seconds + stats.draft_seconds
            if drafter is None:
                new_tokens = self._autoregressive_step(root, len(prompt) + len(tokens) - 1,
                                                       target_cache, request, generator, stats)
            else:
                new_tokens = self._speculative_step(root, len(prompt) + len(tokens) - 1, layout,
                                                    drafter, chooser, target_cache, request,
                                                    generator, stats)
            new_tokens = new_tokens[: request.max_new_tokens - len(tokens)]
            new_tokens, finish = self._cut_at_eos(tokens, new_tokens, request)
            tokens += new_tokens
            accepted.append(len(new_tokens))
            stats.target_forwards += 1
            step_forwards = stats.target_seconds + stats.draft_seconds - forward_seconds
            stats.other_seconds += self._clock() - step_start - step_forwards
            root = tokens[-1]
            yield new_tokens
        return GenerationResult(tokens, accepted, stats, prefill_seconds, request.method, finish)

    def _autoregressive_step(self, root, position, cache, request, generator, stats):
        start = self._clock()
        logits = kvcache.forward(self.target, torch.tensor([root], device=self.device),
                                 torch.tensor([position], device=self.device), cache, rows=1)
        stats.target_seconds += self._clock() - start
        return [self._sample_one(logits[0], request, generator)]

    def _speculative_step(self, root, root_position, layout, drafter, chooser, cache, request,
                          generator, stats):
        """Draft the tree, verify it in one target forward, keep the accepted path."""
        from redwood.sampling import process_logits
        from redwood.verify import verify_greedy, verify_tree

        proposal = drafter.propose(root, layout, chooser, request.draft_confidence, self._layout_of)
        layout, tree = proposal.layout, proposal.layout.tree     # pruned when draft_confidence > 0
        stats.draft_seconds += proposal.draft_seconds
        stats.draft_forwards += proposal.draft_forwards
        stats.tree_nodes += len(tree) - 1

        start = self._clock()
        mask = kvcache.tree_attention_mask(root_position, layout.ancestor, self.target.dtype)
        positions = root_position + layout.depths
        logits = kvcache.forward(self.target, proposal.tokens, positions, cache, mask)   # [n, V]
        stats.target_seconds += self._clock() - start

        if request.greedy:
            path, bonus = verify_greedy(logits.argmax(dim=-1), proposal.tokens, tree)
        else:
            target_probs = process_logits(logits, request.temperature, request.top_k, request.top_p)
            replacement = request.method in ("specinfer", "chain")
            path, bonus = verify_tree(target_probs, proposal.draft_probs, proposal.tokens, tree,
                                      replacement, generator)
        kvcache.keep_tail(cache, root_position, torch.tensor(path, device=self.device))
        drafter.commit(path, proposal.tokens)
        for depth in range(1, len(path)):
            stats.accepted_at_depth[depth - 1] += 1
        return [int(proposal.tokens[u]) for u in path[1:]] + [int(bonus)]

    # -- helpers ------------------------------------------------------------------------------
    def _sample_one(self, logits, request, generator) -> int:
        """Sample one token from the target's logits [V] (argmax when greedy)."""
        if request.greedy:
            return int(logits.argmax())
        from redwood.sampling import process_logits, sample_token

        probs = process_logits(logits, request.temperature, request.top_k, request.top_p)
        return int(sample_token(probs, generator))

    def _chooser(self, request, generator) -> ChildChooser:
        return ChildChooser(request.greedy, request.temperature, request.top_k, request.top_p,
                            replacement=request.method in ("specinfer", "chain"), generator=generator)

    @staticmethod
    def _method_tree(method: str, tree: Tree) -> Tree:
        """The tree a method runs (chain: one child per level, as deep as the tree)."""
        if method == "chain":
            return Tree(list(range(-1, tree.num_levels - 1)), {"kind": "chain"})
        return tree

    def _layout_of(self, tree: Tree) -> TreeLayout:
        """A tree's layout, cached (pruned subtrees of a few trees recur step after step)."""
        key = tuple(tree.parents)
        if key not in self._layouts:
            if len(self._layouts) >= 256:               # requests may bring their own trees
                self._layouts.clear()
            self._layouts[key] = TreeLayout.build(tree, self.device)
        return self._layouts[key]

    def _cut_at_eos(self, tokens, new_tokens, request):
        for i, token in enumerate(new_tokens):
            if request.stop_on_eos and token in self.eos_ids:
                return new_tokens[: i + 1], "eos"
        done = len(tokens) + len(new_tokens) >= request.max_new_tokens
        return new_tokens, ("length" if done else None)

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _validate(self, input_ids, max_new_tokens, temperature, top_p, top_k, seed, method,
                  stop_on_eos, tree, draft_confidence=0.0) -> Request:
        ids = torch.as_tensor(input_ids)
        if ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.dim() != 1 or ids.dtype not in (torch.int64, torch.int32):
            raise RedwoodError(f"input_ids must be a 1-D or [1, L] integer tensor, got shape "
                               f"{tuple(ids.shape)} and dtype {ids.dtype}")
        if ids.numel() == 0:
            raise RedwoodError("the prompt is empty: give at least one token")
        check_sampling(max_new_tokens, temperature, top_p, top_k)
        check_draft_confidence(draft_confidence)
        if method not in METHODS:
            raise RedwoodError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        vocab = self.target.config.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise RedwoodError(f"prompt token ids must lie in [0, {vocab}), got {int(ids.min())}..{int(ids.max())}")
        if not isinstance(tree, Tree):
            raise RedwoodError(f"tree must be a redwood.Tree, got {type(tree).__name__}")
        needed = ids.numel() + max_new_tokens + tree.num_levels
        if self.max_positions is not None and needed > self.max_positions:
            raise RedwoodError(
                f"prompt ({ids.numel()} tokens) + max_new_tokens ({max_new_tokens}) + tree depth "
                f"({tree.num_levels}) = {needed} exceeds the model context of {self.max_positions} "
                "positions; shorten the prompt or lower max_new_tokens")
        return Request(ids.long(), max_new_tokens, float(temperature), float(top_p), top_k, seed,
                       method, stop_on_eos, tree, float(draft_confidence))


def check_sampling(max_new_tokens, temperature, top_p, top_k) -> None:
    """Raise RedwoodError on sampling settings that are out of range."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise RedwoodError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not isinstance(temperature, (int, float)) or math.isnan(temperature) or temperature < 0:
        raise RedwoodError(f"temperature must be a number >= 0, got {temperature!r}")
    if not isinstance(top_p, (int, float)) or not (0.0 < top_p <= 1.0):
        raise RedwoodError(f"top_p must be in (0, 1], got {top_p!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise RedwoodError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")


def check_draft_confidence(value) -> None:
    """Raise RedwoodError unless value is a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or not 0.0 <= value < 1.0:
        raise RedwoodError(f"draft_confidence must be a number in [0, 1) (0 = draft the whole "
                           f"tree), got {value!r}")


def _as_tree(tree) -> Tree:
    if tree is None:
        from redwood.presets import default_tree

        return default_tree()
    if isinstance(tree, Tree):
        return tree
    return Tree.load(tree)


def _eos_ids(model) -> set[int]:
    ids = getattr(model.generation_config, "eos_token_id", None) if model.generation_config else None
    if ids is None:
        ids = model.config.eos_token_id
    if ids is None:
        return set()
    return set(ids) if isinstance(ids, (list, tuple)) else {int(ids)}


def _max_positions(*models) -> int | None:
    limits = [getattr(m.config, "max_position_embeddings", None) for m in models]
    limits = [x for x in limits if x]
    return min(limits) if limits else None
