"""What one generation is: the request's decode options, its live state, and the `Stream`
the engine returns (iterate for each step's new tokens; `result` at the end)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from redwood.decode.drafter import Drafter
from redwood.decode.stats import GenerationResult, StepStats
from redwood.plan.tree import Tree


@dataclass(frozen=True)
class DecodeOptions:
    """What a request asks of the decoder besides sampling."""
    method: str = "sequoia"
    stop_on_eos: bool = True
    tree: Tree | None = None
    draft_confidence: float = 0.0      # prune drafting below draft tokens less probable than this
    fuse_prefill: bool = True          # the target runs prompt[:-1] with the first tree where
                                       # its prefill_tree is one forward (§5.4)
    cache_prompt: bool = True          # reuse the cached prefix the prompt starts with (§5.5)
    ngram_memory: bool = True          # n-gram drafting from earlier requests' answers (§3.3)


@dataclass
class DecodeState:
    """The live state of one generation (exposed on the Stream for inspection and tests)."""
    target: object = None              # the target Backend
    drafter: Drafter | None = None
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
