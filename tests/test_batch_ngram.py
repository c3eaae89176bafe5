"""Prompt-lookup drafting in the batch (serve/batch_ngram.py) on tiny random GGUF models: greedy
output equals plain decoding token for token while copies are drafted and kept, sampled output
follows the target's law (chi-square), the memory of earlier answers feeds later requests (and
never a cancelled one), and every cell is free afterwards.

Prompts that copy: a start followed by the target's own greedy continuation of it. A random
model's greedy text falls into cycles, so what it says next repeats spans the prompt holds: the
n-gram drafter finds those matches. The starts were scanned once for answers whose 30 greedy
tokens have top-2 margins >= 0.1 and mostly follow the prompt's own 2-grams."""
from __future__ import annotations

from collections import Counter

import httpx
import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp")

from redwood.decode.ngram_acceptance import AcceptanceModel  # noqa: E402
from redwood.decode.ngram_memory import NgramMemory  # noqa: E402
from redwood.decode.params import SamplingParams  # noqa: E402
from redwood.errors import RedwoodError  # noqa: E402
from redwood.models.hf_loading import load_tokenizer  # noqa: E402
from redwood.plan.batch_planner import ROOT_ONLY, FixedPlanner  # noqa: E402
from redwood.plan.formats import Profile  # noqa: E402
from redwood.serve.app import ServerConfig, create_app  # noqa: E402
from redwood.serve.batch_ngram import BatchNgramDrafting  # noqa: E402
from redwood.serve.batch_requests import BatchRequest  # noqa: E402
from redwood.serve.batching import BatchScheduler  # noqa: E402
from test_batching import (CLEAR_PROMPTS, N_BATCH, TOL, assert_all_free, contexts,  # noqa: E402,F401
                           engine, joint_law, paths)
from test_server import metric, running, scrape  # noqa: E402
from test_verify import assert_law  # noqa: E402
from tiny_gguf import tiny_gguf_pair  # noqa: E402,F401

# flat costs: on the tiny models a tree costs about what one token does, so copies pay
FLAT = Profile({n: 2.0 + 0.01 * n for n in range(1, 65)}, {1: 0.1})
CHI_DRAWS = 1500
COPY_STARTS = [[184, 59, 33], [80, 195, 151, 241, 34, 44], [44, 19, 37], [216, 157, 59, 75, 219, 217]]


class TakenAtItsWord(AcceptanceModel):
    """A pooled model whose draft ratio stays 1: at T = 1 the tiny pair keeps far less than
    its node estimates say, and the calibrated ratio (rightly) stops drafting after a few
    requests; an exactness test needs the first steps to keep verifying proposals."""

    def draft_ratio(self, greedy: bool, predicted: float = 0.0) -> float:
        return 1.0


def ngram_scheduler(contexts, memory=None, model_factory=AcceptanceModel,
                    **options) -> BatchScheduler:
    drafting = BatchNgramDrafting(FLAT, model_factory, memory, depth=16)
    return BatchScheduler(contexts[0], None, FixedPlanner(ROOT_ONLY, N_BATCH), ngram=drafting,
                          **options)


def plain(engine, prompt, n) -> list[int]:
    return engine.generate(torch.tensor(prompt), n, method="autoregressive",
                           stop_on_eos=False).tokens


def copying_prompt(engine, start, n=40) -> list[int]:
    return list(start) + plain(engine, start, n)


def test_batched_ngram_greedy_equals_plain_and_keeps_copies(contexts, engine):
    """Four requests at once (three that copy, one that does not): each output equals plain
    greedy decoding of its prompt; copies are drafted and kept; the trees are sized together
    within one decode (n_batch 128), and what a drafter proposed is what ran."""
    prompts = [copying_prompt(engine, start) for start in COPY_STARTS[:3]] + [CLEAR_PROMPTS[2]]
    sched = ngram_scheduler(contexts)
    requests = [sched.submit(BatchRequest(p, SamplingParams(30), stop_on_eos=False))
                for p in prompts]
    sched.run(2000)
    reference = engine.target_backend
    for request, prompt in zip(requests, prompts):
        expected = plain(engine, prompt, 30)
        reference.reset()
        top = reference.append(prompt + expected, rows=31)[:-1].topk(2, dim=-1).values
        assert (top[:, 0] - top[:, 1]).min() > 2 * TOL, f"{prompt}: a near-tie, not a fair test"
        assert request.tokens == expected
        assert request.finish_reason == "length" and sum(request.steps) == 30
    copies = requests[:3]
    assert all(max(r.tree_sizes) > 1 for r in copies)                  # drafted
    assert sum(sum(r.steps) for r in copies) > 1.5 * sum(len(r.steps) for r in copies)  # kept
    for r in copies:
        proposed = sum(p for _, p in r.match_counts.values())
        assert proposed == sum(size - 1 for size in r.tree_sizes)      # what ran, nothing else
        # every tree came with the drafter's E(tokens kept); the kept count is the path's
        # (accepted + bonus), the step's emitted tokens but for a cut at max_tokens
        spec = [n for size, n in zip(r.tree_sizes, r.steps) if size > 1]
        stats = r.prediction
        assert stats.predicted_steps == len(spec) > 0
        assert sum(spec) <= stats.predicted_steps_tokens <= sum(spec) + max(r.tree_sizes)
        assert stats.predicted_tokens >= stats.predicted_steps      # E >= 1 (the bonus)
    assert requests[3].prediction.predicted_steps <= len(requests[3].steps)
    assert_all_free(contexts[0])


# a 2-core CPU's curve: verifying k tokens costs nearly k single steps
STEEP = Profile({n: 30.0 + 25.0 * n for n in range(1, 65)}, {1: 0.1})


def test_requests_decoding_together_size_their_trees_jointly(contexts, engine):
    """On a steep cost curve a drafted node makes every request in the step wait: four copying
    requests at once draft fewer nodes a step each than the same requests alone (the joint rule
    of plan/joint_sizes.py), and the output is still plain greedy decoding's."""
    prompts = [copying_prompt(engine, start) for start in COPY_STARTS]
    drafting = BatchNgramDrafting(STEEP, AcceptanceModel, None, depth=16)
    sched = BatchScheduler(contexts[0], None, FixedPlanner(ROOT_ONLY, N_BATCH), ngram=drafting)
    alone = []
    for prompt in prompts:
        request = sched.submit(BatchRequest(prompt, SamplingParams(30), stop_on_eos=False,
                                            cache_prompt=False))
        sched.run(1000)
        alone += [size - 1 for size in request.tree_sizes[1:]]
    requests = [sched.submit(BatchRequest(p, SamplingParams(30), stop_on_eos=False,
                                          cache_prompt=False)) for p in prompts]
    together = []
    while not all(r.done for r in requests):
        sched.step()
        if sched.last.decoding == len(prompts):
            together += [size - 1 for size in sched.last.tree_sizes]
    for request, prompt in zip(requests, prompts):
        assert request.tokens == plain(engine, prompt, 30)
    assert sum(alone) > 0 and together
    assert sum(together) / len(together) < 0.8 * sum(alone) / len(alone)
    assert_all_free(contexts[0])


def test_the_batched_server_reports_predicted_against_kept(contexts, engine, paths):
    """The response's `redwood` field carries predicted_vs_observed, and /metrics sums it."""
    sched = ngram_scheduler(contexts)
    app = create_app(sched, load_tokenizer(paths[0]), ServerConfig(model_name="tiny"))
    with running(app) as url, httpx.Client(timeout=120) as http:
        response = http.post(url + "/v1/completions", json={
            "model": "tiny", "prompt": copying_prompt(engine, COPY_STARTS[0]), "max_tokens": 30,
            "temperature": 0})
        assert response.status_code == 200, response.text
        samples = scrape(url)
    report = response.json()["redwood"]["predicted_vs_observed"]
    assert report["steps"] > 0 and report["observed_tokens_per_step"] > 1.0
    assert 0.05 <= response.json()["redwood"]["draft_ratio"] <= 1.5
    assert metric(samples, "redwood_drafter_predicted_steps_total") == report["steps"]
    observed = metric(samples, "redwood_drafter_observed_tokens_total")
    assert observed == pytest.approx(report["steps"] * report["observed_tokens_per_step"])
    assert_all_free(contexts[0])


def test_batched_ngram_sampling_follows_the_target(contexts, engine):
    """T = 1: the first two tokens of requests whose prompt is cached (so their first step
    verifies an n-gram tree at once) follow the target's own joint law, two at a time beside
    a long sampled request."""
    prompt = copying_prompt(engine, COPY_STARTS[3])
    sched = ngram_scheduler(contexts, model_factory=TakenAtItsWord)
    sched.submit(BatchRequest(prompt, SamplingParams(2, 1.0, seed=10**6), stop_on_eos=False))
    sched.run(100)                                   # the prompt is cached from here on
    background, counts, drafted, pending, seed = None, Counter(), 0, [], 0
    for step in range(20 * CHI_DRAWS):
        if background is None or background.done:
            background = sched.submit(BatchRequest(CLEAR_PROMPTS[step % 8],
                                                   SamplingParams(60, 0.8, seed=step),
                                                   stop_on_eos=False))
        while len(pending) < 2 and seed < CHI_DRAWS:
            pending.append(sched.submit(BatchRequest(prompt, SamplingParams(2, 1.0, seed=seed),
                                                     stop_on_eos=False)))
            seed += 1
        sched.step()
        for request in [r for r in pending if r.done]:
            pending.remove(request)
            counts[tuple(request.tokens)] += 1
            drafted += request.tree_sizes[0] > 1
        if seed == CHI_DRAWS and not pending:
            break
    assert sum(counts.values()) == CHI_DRAWS
    assert drafted > CHI_DRAWS // 2                  # most first steps verified a proposal
    assert_law(counts, joint_law(engine.target_backend, 1.0, prompt), CHI_DRAWS)
    sched.close()
    assert_all_free(contexts[0])


def test_batched_ngram_memory_feeds_later_requests_but_not_cancelled_ones(contexts, engine):
    """A finished answer goes to the shared memory: a later request that gives the same
    answer to a prompt that does not contain it drafts it from there. A cancelled request
    stores nothing; a request may opt out (ngram_memory False)."""
    memory = NgramMemory(max_tokens=4096)
    sched = ngram_scheduler(contexts, memory)
    first = sched.submit(BatchRequest(CLEAR_PROMPTS[4], SamplingParams(40), stop_on_eos=False))
    sched.run(1000)
    assert len(memory) > 0 and first.tokens == plain(engine, CLEAR_PROMPTS[4], 40)
    again = sched.submit(BatchRequest(CLEAR_PROMPTS[4], SamplingParams(40), stop_on_eos=False,
                                      cache_prompt=False))
    sched.run(1000)
    assert again.tokens == first.tokens
    assert len(again.steps) < 0.7 * len(first.steps)      # its answer came from the memory
    held = len(memory)
    cancelled = sched.submit(BatchRequest(CLEAR_PROMPTS[5], SamplingParams(40),
                                          stop_on_eos=False))
    for _ in range(5):
        sched.step()
    cancelled.cancel()
    sched.run(100)
    opted_out = sched.submit(BatchRequest(CLEAR_PROMPTS[6], SamplingParams(20),
                                          stop_on_eos=False, ngram_memory=False))
    sched.run(1000)
    assert cancelled.finish_reason == "cancelled" and opted_out.finish_reason == "length"
    assert len(memory) == held
    assert_all_free(contexts[0])


def test_every_request_reads_and_teaches_one_acceptance_model(contexts, engine):
    """What one request's steps showed about acceptance (by match length, depth and rank) is
    what the next request drafts with, as in the single-request engine."""
    sched = ngram_scheduler(contexts)
    model = sched.ngram.model
    first = sched.submit(BatchRequest(copying_prompt(engine, COPY_STARTS[0]), SamplingParams(20),
                                      stop_on_eos=False))
    sched.run(1000)
    learnt = {key: list(counts) for key, counts in model.counts.items()}
    assert first.finish_reason == "length" and sum(t for _, t in learnt.values()) > 0
    second = sched.submit(BatchRequest(copying_prompt(engine, COPY_STARTS[1]),
                                       SamplingParams(20), stop_on_eos=False))
    sched.step()
    assert sched.live[0].ngram.model is model
    sched.run(1000)
    assert second.finish_reason == "length"
    assert sum(c[1] for c in model.counts.values()) > sum(t for _, t in learnt.values())
    assert_all_free(contexts[0])


def test_the_batch_drafts_from_one_source(contexts):
    with pytest.raises(RedwoodError, match="not both"):
        BatchScheduler(contexts[0], contexts[1], FixedPlanner(ROOT_ONLY, N_BATCH),
                       ngram=BatchNgramDrafting(FLAT, AcceptanceModel))


def test_seeded_text_is_the_same_drafted_or_not_on_the_engine_and_in_the_batch(contexts, engine):
    """Prompts that copy (a start, then the target's own greedy text): at T = 0.6 with a seed,
    prompt lookup on the engine and in the batch gives plain sampling's text token for token.
    One request at a time: lanes decoding together change the kernels' shapes, whose logit
    noise (TOL) flips a sampled token now and then on this 512-token random model, drafted or
    not. Sent again with its seed, a request replays its text, drafted from the memory of its
    first answer in fewer steps."""
    from redwood.decode.engine import Engine
    from redwood.decode.ngram_drafter import NgramDrafter
    from redwood.plan.tree import Tree

    ngram = Engine(engine.target_backend, None, Tree([-1, 0, 0, 1, 3, 4, 5, 6]),
                   drafter=NgramDrafter())
    prompts = [copying_prompt(engine, start) for start in COPY_STARTS[:3]]
    params = [SamplingParams(30, temperature=0.6, seed=seed) for seed in range(3)]
    plain, nodes = [], 0
    for prompt, p in zip(prompts, params):
        plain.append(ngram.generate(torch.tensor(prompt), params=p, method="autoregressive",
                                    stop_on_eos=False).tokens)
        drafted = ngram.generate(torch.tensor(prompt), params=p, method="sequoia",
                                 stop_on_eos=False)
        assert drafted.tokens == plain[-1], p.seed
        nodes += drafted.stats.tree_nodes
    assert nodes > 0
    drafting = BatchNgramDrafting(FLAT, AcceptanceModel, NgramMemory(max_tokens=4096), depth=16)
    sched = BatchScheduler(contexts[0], None, FixedPlanner(ROOT_ONLY, 128), ngram=drafting)
    first = []
    for prompt, p in zip(prompts, params):
        first.append(sched.submit(BatchRequest(prompt, p, stop_on_eos=False)))
        sched.run(2000)
    assert [r.tokens for r in first] == plain
    assert any(max(r.tree_sizes) > 1 for r in first)
    again = sched.submit(BatchRequest(prompts[0], params[0], stop_on_eos=False))
    sched.run(2000)
    assert again.tokens == plain[0]
    assert len(again.steps) < len(first[0].steps), (again.steps, first[0].steps)
    assert_all_free(contexts[0])
