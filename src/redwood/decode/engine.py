"""The speculative decoding engine: draft a tree, verify it in one target forward,
keep the accepted path, repeat.

    engine = Engine(target, draft, tree)          # models (transformers) or Backends
    result = engine.generate(input_ids, max_new_tokens=64, temperature=0.0)

The loop talks only to a `Backend` (the target) and a `Drafter`. Cache invariant between
steps: the target holds every token except the current root (the newest token); each step
runs the root plus the tree's nodes as one tree (docs/design.md §1). Where the target runs
prefill_tree in one forward (transformers), its prefill is the first step's forward too
(docs/design.md §5.4); elsewhere (llama.cpp) the whole prompt's prefill gives the first token,
as the runtime's own loop does, and the first tree grows below it.
"""
from __future__ import annotations

import time

import torch

from redwood.decode.draft_model import DraftModelDrafter
from redwood.decode.drafter import ChildChooser, Drafter
from redwood.decode.governor import Governor, draft_ms, step_ms
from redwood.decode.layout import LayoutCache
from redwood.decode.params import SamplingParams, check_draft_confidence
from redwood.decode.native_sampling import prepare as prepare_native
from redwood.decode.plain_sampling import PlainSampler
from redwood.decode.request import (as_backend, as_tree, check_request, check_same_vocab,
                                    draft_ratio, finish_drafters, match_counts, method_tree,
                                    set_for_request)
from redwood.decode.stats import GenerationResult, StepStats
from redwood.decode.stream import DecodeOptions, DecodeState, Stream
from redwood.decode.token_sampler import TokenSampler
from redwood.decode.verify import verify_step
from redwood.errors import RedwoodError
from redwood.plan.live_costs import LiveCosts
from redwood.plan.tree import Tree


class Engine:
    def __init__(self, target, draft, tree: Tree | str | None = None,
                 draft_confidence: float = 0.0, drafter: Drafter | None = None,
                 profile=None, fuse_prefill: bool = True, live_costs: bool = True,
                 clock=time.perf_counter, prompt_cache: bool = True):
        """target, draft: transformers models or `Backend`s (redwood.backends). tree: the
        default tree for requests; draft_confidence: their default pruning threshold (see
        `stream`). Requests may override both. drafter: a `Drafter` to use instead of the
        draft model (then `draft` may be None). profile: this machine's latency profile
        (plan.formats.Profile); with it every speculative request is governed: it speculates
        only while that pays on this request (decode/governor.py). fuse_prefill: the
        requests' default for fusing the target's prefill into the first verification
        (docs/design.md §5.4; False = a separate prefill forward, for A/B). live_costs: with a
        profile, correct its costs by what each request's forwards take (plan/live_costs.py;
        False = the profile alone: seeded sampled requests then repeat token for token).
        clock: seconds, for every timing (tests inject one). prompt_cache: the requests'
        default for reusing the KV of the longest prefix a prompt shares with what the backends
        hold from the previous request (backends with keep_prefix: llama.cpp; docs/design.md
        §5.5); False = every request prefills its whole prompt."""
        check_draft_confidence(draft_confidence)
        self.draft_confidence = float(draft_confidence)
        self.target, self.draft = target, draft
        self.target_backend = as_backend(target)
        self.draft_backend = as_backend(draft) if draft is not None else None
        if self.draft_backend is not None:
            check_same_vocab(self.target_backend, self.draft_backend)
        self.tree = as_tree(tree)
        self.device = self.target_backend.device
        self.eos_ids = set(self.target_backend.eos_ids)
        limits = [b.max_positions for b in (self.target_backend, self.draft_backend)
                  if b is not None and b.max_positions]
        self.max_positions = min(limits) if limits else None
        self.layouts = LayoutCache(self.device)
        if drafter is None and self.draft_backend is None:
            raise RedwoodError("give a draft model (or backend) or a drafter")
        self.drafter = drafter or DraftModelDrafter(self.draft_backend, self._clock, self.layouts)
        self._owner = None                 # the live stream: backends hold one sequence
        self.profile = profile
        self.fuse_prefill = bool(fuse_prefill)
        self.prompt_cache = bool(prompt_cache)
        self.live_costs = bool(live_costs)
        self._clock_fn = clock
        self.last_costs: LiveCosts | None = None     # the latest request's, for inspection
        self._plain_sampler = PlainSampler()
        prepare_native()             # its C call built now (once per machine), not mid-request

    # -- public API ---------------------------------------------------------------------
    def generate(self, input_ids, max_new_tokens: int | None = None, **options) -> GenerationResult:
        stream = self.stream(input_ids, max_new_tokens, **options)
        for _ in stream:
            pass
        return stream.result

    def stream(self, input_ids, max_new_tokens: int | None = None, temperature: float = 0.0,
               top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
               method: str = "sequoia", stop_on_eos: bool = True, tree: Tree | None = None,
               draft_confidence: float | None = None, params: SamplingParams | None = None,
               fuse_prefill: bool | None = None, cache_prompt: bool | None = None,
               ngram_memory: bool = True) -> Stream:
        """Generate lazily. Sampling comes from `params` or from the keyword arguments;
        `tree` overrides the engine's tree for this request only.

        draft_confidence in [0, 1): 0 drafts the whole tree every step; above 0 a node gets
        children only while the draft gave every token on its path a probability at or
        above this value, so the tree adapts to how predictable the text is (output stays exact).
        None = the engine's default. fuse_prefill: run the target's prefill in the same forward
        as the first tree (None = the engine's default; the output is the same either way).
        cache_prompt: reuse the cached prefix (None = the engine's prompt_cache).
        ngram_memory: an n-gram drafter with a memory drafts from earlier answers and stores
        this one (False: neither, for this request).
        One stream runs at a time per engine: starting another ends the previous one (its
        iteration then raises RedwoodError).
        """
        if params is None:
            params = SamplingParams(max_new_tokens, temperature, top_p, top_k, seed)
        elif max_new_tokens is not None and max_new_tokens != params.max_new_tokens:
            raise RedwoodError("give max_new_tokens in params or as an argument, not both")
        options = DecodeOptions(method, stop_on_eos, tree if tree is not None else self.tree,
                                self.draft_confidence if draft_confidence is None else draft_confidence,
                                self.fuse_prefill if fuse_prefill is None else bool(fuse_prefill),
                                self.prompt_cache if cache_prompt is None else bool(cache_prompt),
                                bool(ngram_memory))
        prompt = check_request(input_ids, params, options, self.target_backend,
                               self.draft_backend, self.max_positions)
        state = DecodeState()
        owner = object()
        self._owner = owner
        return Stream(self._run(prompt, params, options, state, owner), state)

    # -- the loop -------------------------------------------------------------------------
    @torch.inference_mode()
    def _run(self, prompt, params: SamplingParams, options: DecodeOptions, state: DecodeState, owner):
        generator = torch.Generator(device=self.device)
        generator.manual_seed(params.seed if params.seed is not None else torch.seed())
        layout = self.layouts(method_tree(options.method, options.tree))
        speculative = options.method != "autoregressive" and len(layout.tree) > 1
        stats = StepStats(accepted_at_depth=[0] * (layout.tree.num_levels - 1 if speculative else 0))
        target, prompt = self.target_backend, prompt.to(self.device)

        start = self._clock()
        drafter = self.drafter if speculative else None
        first_logits, unrun = self._prefill(prompt, drafter, options, stats)
        stats.acceptance_by_match = match_counts(drafter)      # live: filled as steps commit
        prefill_seconds = self._clock() - start
        chooser = ChildChooser.for_request(params, options.method, generator)
        sampler = TokenSampler(params, generator, self._plain_sampler)
        governor = self._governor(drafter, len(prompt))
        costs = getattr(governor, "costs", None)
        # a drafter that sizes every step on the live costs (n = 1: a plain step) is not
        # second-guessed by the governor's history (decode/governor.py)
        governed = governor is not None and not getattr(drafter, "sizes_itself", False)

        root, tokens, accepted, finish = int(prompt[-1]), [], [], None
        state.target, state.drafter, state.prompt = target, drafter, prompt
        state.tokens, state.accepted, state.stats = tokens, accepted, stats
        state.prefill_seconds, state.method = prefill_seconds, options.method
        while finish is None:
            if self._owner is not owner:
                raise RedwoodError("another generation started on this engine; a backend holds "
                                   "one sequence at a time (use one engine per concurrent stream)")
            step_start, forward_seconds = self._clock(), stats.target_seconds + stats.draft_seconds
            if costs is not None:
                costs.follow(len(prompt) + len(tokens))
            if first_logits is not None:         # the prefill's last row: no forward
                new_tokens, first_logits = [sampler.token(first_logits[0], len(tokens))], None
            elif drafter is None:
                new_tokens = self._autoregressive_step(root, sampler, len(tokens), stats)
            elif governed and not governor.speculate():
                new_tokens = self._autoregressive_step(root, sampler, len(tokens), stats, unrun,
                                                       costs)
                drafter.skip(root)
                stats.plain_steps += 1
            else:
                new_tokens = self._speculative_step(root, layout, chooser, sampler, len(tokens),
                                                    options, stats, governor, unrun)
            unrun = None                             # the first step ran the rest of the prompt
            new_tokens = new_tokens[: params.max_new_tokens - len(tokens)]
            new_tokens, finish = self._cut_at_eos(tokens, new_tokens, params, options)
            tokens += new_tokens
            accepted.append(len(new_tokens))
            stats.target_forwards += 1
            if governor is not None:                 # live figures, for --json and the server
                stats.governor = governor.as_dict()
            step_forwards = stats.target_seconds + stats.draft_seconds - forward_seconds
            stats.other_seconds += self._clock() - step_start - step_forwards
            root = tokens[-1]
            yield new_tokens
        finish_drafters(drafter)
        stats.draft_ratio = draft_ratio(drafter)
        return GenerationResult(tokens, accepted, stats, prefill_seconds, options.method, finish)

    def _prefill(self, prompt, drafter, options: DecodeOptions, stats: StepStats):
        """(first logits, unrun). With options.cache_prompt, the target (and the draft) keep
        the longest cached prefix of what they would prefill and run only the rest
        (stats.cached_prompt_tokens: the target's kept tokens).

        Fused (a speculative request whose target runs prefill_tree in one forward:
        transformers): the draft prefills prompt[:-1], the target nothing; prompt[:-1] is
        returned as `unrun` [L-1] and the first step runs it in its verify forward with
        root = prompt[-1] (docs/design.md §5.4), so prefill_seconds holds the draft's prefill
        alone. Otherwise (plain decoding, llama.cpp, fuse_prefill=False): the target prefills
        the whole prompt and its last row's logits [1, V] give the first token, exactly as the
        runtime's own generation loop and llama-server do (llama.cpp's kernels differ by batch
        shape, so near-ties then resolve as plain llama.cpp's); the drafter holds the whole
        prompt and the first new token is the first root."""
        target = self.target_backend
        reuse = options.cache_prompt and hasattr(target, "keep_prefix")
        set_for_request(drafter, "reuse_prefix", options.cache_prompt)
        set_for_request(drafter, "use_memory", options.ngram_memory)
        # the last prompt token is always run: its logits (plain) or it is the first root
        kept = target.keep_prefix(prompt, len(prompt) - 1) if reuse else 0
        if not reuse:
            target.reset()
        stats.cached_prompt_tokens = kept
        fuse = drafter is not None and options.fuse_prefill and \
            getattr(target, "fused_prefill_tree", False)
        if not fuse:
            first_logits = target.append(prompt[kept:], rows=1)
            if drafter is not None:
                drafter.prefill(prompt)
            return first_logits, None
        drafter.prefill(prompt[:-1])
        return None, prompt[kept:-1]

    def _governor(self, drafter, context: int) -> Governor | None:
        """A speculative request's governor (with a profile), its costs live unless the
        engine was built with live_costs=False; the drafter sizes its trees on the same costs.
        Predictions are the profile's at the prompt's context (plan.formats.Profile.target_ms_at),
        so the live ratios correct what the context does not explain, and a drafter that reads
        its own table by context does not count the context twice."""
        if drafter is None or self.profile is None:
            return None
        table = self.profile.target_ms_at(context)
        plain_ms = table[min(table)]
        costs = LiveCosts.for_request(self.profile, context) if self.live_costs else None
        self.last_costs = costs
        set_for_request(drafter, "costs", costs)
        return Governor(plain_ms=plain_ms, prior_tokens_per_ms=1.0 / plain_ms, costs=costs)

    def _autoregressive_step(self, root, sampler, position, stats, unrun=None, costs=None):
        """One plain target token, the request's `position`-th new one. unrun: prompt tokens
        the target has not run yet (a fused request whose first step the governor made plain):
        they go first in the same forward.
        costs: a governed request's LiveCosts, which learns what a plain step costs."""
        ids = [root] if unrun is None else unrun.tolist() + [root]
        stats.fused_prefill = stats.fused_prefill or unrun is not None
        target = self.target_backend
        view = getattr(target, "append_logits_view", None)      # llama.cpp: no row copy
        start = self._clock()
        logits = view(ids) if view is not None else target.append(ids, rows=1)[0]
        seconds = self._clock() - start
        stats.target_seconds += seconds
        if costs is not None and unrun is None:
            costs.record_target(1, seconds)
        return [sampler.token(logits, position)]    # read before the next decode reuses it

    def _speculative_step(self, root, layout, chooser, sampler, position, options, stats,
                          governor=None, unrun=None):
        """Draft the tree, verify it in one target forward, keep the accepted path (the
        request's new tokens from `position` on). unrun: see _verify_forward."""

        growth = getattr(self.drafter, "growth", None)
        if growth is not None and governor is not None:     # the bar a grown tree must earn
            growth.bar = max(governor.tokens_per_ms, 1.0 / governor.plain_ms)
        proposal = self.drafter.propose(root, layout, chooser, options.draft_confidence)
        tree = proposal.layout.tree                              # pruned when draft_confidence > 0
        stats.draft_seconds += proposal.draft_seconds
        stats.draft_forwards += proposal.draft_forwards
        stats.tree_nodes += len(tree) - 1
        costs = getattr(governor, "costs", None)
        if len(tree) == 1 and unrun is None:    # nothing drafted: the plain step's fast path
            new_tokens = self._autoregressive_step(root, sampler, position, stats, None, costs)
            self.drafter.commit([0], proposal.tokens)
            stats.plain_steps += 1
            return new_tokens

        start = self._clock()
        target = self.target_backend
        logits = self._verify_forward(tree, proposal.tokens, unrun, stats)     # [n, V]
        verify_seconds = self._clock() - start
        stats.target_seconds += verify_seconds
        if costs is not None:                    # what this request's forwards cost (live)
            if unrun is None:
                costs.record_target(len(tree), verify_seconds)
            if proposal.draft_forwards:
                costs.record_draft(draft_ms(self.profile, tree, proposal.draft_forwards),
                                   proposal.draft_seconds)

        path, bonus = verify_step(logits, proposal.tokens, tree, proposal.draft_probs,
                                  proposal.point_mass, chooser, sampler, position)
        target.keep_path(path)
        self.drafter.commit(path, proposal.tokens)
        for depth in range(1, min(len(path), len(stats.accepted_at_depth) + 1)):
            stats.accepted_at_depth[depth - 1] += 1
        if proposal.sources is not None:
            for u in path[1:]:
                source = proposal.sources[u]
                stats.accepted_by_source[source] = stats.accepted_by_source.get(source, 0) + 1
        if governor is not None:
            governor.record(len(path), step_ms(self.profile, tree, proposal.draft_forwards, costs))
        if proposal.expected_tokens is not None:     # the drafter's prediction against the kept
            stats.record_prediction(proposal.expected_tokens, len(path))
        return [int(proposal.tokens[u]) for u in path[1:]] + [int(bonus)]

    def _verify_forward(self, tree, tokens, unrun, stats):
        """The target's logits [n, V] over the drafted tree (root included). unrun: prompt
        tokens the target has not run yet (a fused request's first step, see _prefill): they
        are committed in the same forward (prefill_tree), whose time counts as this step's
        target time. The tree was drafted before the target ran, so the logits and the
        verification are those of the separate prefill (docs/design.md §5.4)."""
        target = self.target_backend
        if unrun is None:
            return target.run_tree(tree, range(len(tree)), tokens, target.cache_length())
        stats.fused_prefill = True
        return target.prefill_tree(unrun, tree, tokens)

    # -- helpers ------------------------------------------------------------------------------
    def _cut_at_eos(self, tokens, new_tokens, params, options):
        for i, token in enumerate(new_tokens):
            if options.stop_on_eos and token in self.eos_ids:
                return new_tokens[: i + 1], "eos"
        done = len(tokens) + len(new_tokens) >= params.max_new_tokens
        return new_tokens, ("length" if done else None)

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return self._clock_fn()

