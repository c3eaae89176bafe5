"""Per-generation statistics, kept apart from any logging or metrics export."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepStats:
    """Where the time of one generation went, and how much each target forward gained."""
    target_seconds: float = 0.0       # target forwards during decoding (prefill excluded)
    draft_seconds: float = 0.0        # draft forwards during decoding
    other_seconds: float = 0.0        # sampling, verification, cache compaction, bookkeeping
    target_forwards: int = 0          # decoding target forwards (prefill excluded)
    draft_forwards: int = 0
    tree_nodes: int = 0               # draft tokens verified (tree nodes below the root), summed
    plain_steps: int = 0              # steps run without drafting: the governor's (speculation
                                      # lost) and steps whose drafter proposed nothing
    # the target's prompt prefill ran in the first step's forward (its verify, or a governed
    # plain step's; docs/design.md §5.4): its time is then in target_seconds, and
    # prefill_seconds holds the draft's prefill alone
    fused_prefill: bool = False
    cached_prompt_tokens: int = 0     # prompt tokens the target reused from its cache (not run)
    # accepted_at_depth[d] = number of steps whose accepted path reached tree depth d + 1
    accepted_at_depth: list[int] = field(default_factory=list)
    # drafted tokens the target accepted, by who proposed them ("model", "ngram"); filled
    # only by drafters that tag their nodes (Proposal.sources)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    # the governor's live figures (decode/governor.py: speculative and plain steps, live tokens
    # per predicted ms against plain decoding's), updated every step; empty when ungoverned
    governor: dict = field(default_factory=dict)
    # the drafter's own prediction against what the target kept, over the speculative steps
    # whose drafter predicted (Proposal.expected_tokens: the n-gram drafter's E(n))
    predicted_tokens: float = 0.0     # sum of predicted tokens kept (bonus included)
    predicted_steps_tokens: int = 0   # sum of tokens kept on those steps
    predicted_steps: int = 0
    # the n-gram drafter's proposals by match length ("1", "2", "3", "4-7", ... "32+"):
    # label -> [accepted, proposed] draft tokens (decode/ngram_drafter.py)
    acceptance_by_match: dict = field(default_factory=dict)
    # the n-gram drafter's draft ratio when the request ended (kept / predicted drafted tokens
    # over its shadow trees, decode/ngram_shadow.py: the scale on its predictions); None
    # without an n-gram drafter
    draft_ratio: float | None = None

    @property
    def decode_seconds(self) -> float:
        return self.target_seconds + self.draft_seconds + self.other_seconds

    @property
    def draft_tokens_per_step(self) -> float:
        """Mean number of draft tokens the target checked per step (the tree size, pruned)."""
        return self.tree_nodes / self.target_forwards if self.target_forwards else 0.0

    def record_prediction(self, expected_tokens: float, kept_tokens: int) -> None:
        """One speculative step whose drafter predicted `expected_tokens` kept (bonus included)
        and whose target kept `kept_tokens` (the accepted path's nodes, root = the bonus)."""
        self.predicted_tokens += expected_tokens
        self.predicted_steps_tokens += kept_tokens
        self.predicted_steps += 1

    def predicted_vs_observed(self) -> dict:
        """Tokens per step the drafter predicted and the target kept, on the steps it predicted
        (empty when it never did): the calibration check of its acceptance estimates."""
        if not self.predicted_steps:
            return {}
        return {"steps": self.predicted_steps,
                "predicted_tokens_per_step": self.predicted_tokens / self.predicted_steps,
                "observed_tokens_per_step": self.predicted_steps_tokens / self.predicted_steps}

    def match_counts(self) -> dict[str, list[int]]:
        """A copy of acceptance_by_match (the drafter keeps filling the live one)."""
        return {label: list(counts) for label, counts in self.acceptance_by_match.items()}

    def acceptance_by_depth(self) -> list[float]:
        """Fraction of steps that accepted a draft token at depth 1, 2, ... of the tree."""
        if not self.target_forwards:
            return []
        return [count / self.target_forwards for count in self.accepted_at_depth]


@dataclass
class GenerationResult:
    tokens: list[int]                 # new tokens only
    accepted: list[int]               # tokens kept per decoding target forward (incl. the bonus)
    stats: StepStats
    prefill_seconds: float = 0.0
    method: str = "sequoia"
    finish_reason: str = "length"     # "length" | "eos" | "stopped"

    @property
    def decode_seconds(self) -> float:
        return self.stats.decode_seconds

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens kept per decoding target forward (prefill excluded)."""
        return sum(self.accepted) / len(self.accepted) if self.accepted else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decoding throughput: new tokens over decode time (prefill excluded)."""
        return len(self.tokens) / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "tokens": self.tokens, "accepted": self.accepted, "method": self.method,
            "finish_reason": self.finish_reason, "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds, "tokens_per_second": self.tokens_per_second,
            "tokens_per_step": self.tokens_per_step, "target_seconds": self.stats.target_seconds,
            "draft_seconds": self.stats.draft_seconds, "other_seconds": self.stats.other_seconds,
            "target_forwards": self.stats.target_forwards, "draft_forwards": self.stats.draft_forwards,
            "draft_tokens_per_step": self.stats.draft_tokens_per_step,
            "plain_steps": self.stats.plain_steps, "fused_prefill": self.stats.fused_prefill,
            "cached_prompt_tokens": self.stats.cached_prompt_tokens,
            "acceptance_by_depth": self.stats.acceptance_by_depth(),
            "accepted_by_source": dict(self.stats.accepted_by_source),
            "governor": dict(self.stats.governor),
            "predicted_vs_observed": self.stats.predicted_vs_observed(),
            "acceptance_by_match": self.stats.match_counts(),
            "draft_ratio": self.stats.draft_ratio,
        }
