"""The engine on the shipped real pair (Qwen2.5-Coder 1.5B target, 0.5B draft)."""
import pytest

from redwood.decode.engine import Engine
from redwood.measure.bundles import default_tree
from redwood.prompts import encode_prompt, humaneval_prompts
from redwood.plan.tree import Tree

pytestmark = pytest.mark.real


def test_greedy_sequoia_equals_target_greedy_on_humaneval(shipped_pair):
    target, draft, tokenizer = shipped_pair
    # A small branching tree: exercises siblings and depth on the real models.
    engine = Engine(target, draft, Tree([-1, 0, 0, 1, 1, 3]))
    ids = encode_prompt(tokenizer, humaneval_prompts("evaluation")[1])
    reference = engine.generate(ids, 32, method="autoregressive", stop_on_eos=False)
    result = engine.generate(ids, 32, method="sequoia", stop_on_eos=False)
    assert result.tokens == reference.tokens
    assert len(result.tokens) == 32
    # The 0.5B draft agrees with the 1.5B target most of the time on code.
    assert result.tokens_per_step > 1.5
    # Real code comes out (the prompt is a Python function stub), not noise.
    assert tokenizer.decode(result.tokens).strip().startswith(("#", "return", "for", "if", "def", '"'))


def test_default_tree_streams_text(shipped_pair):
    target, draft, tokenizer = shipped_pair
    engine = Engine(target, draft, default_tree())
    ids = encode_prompt(tokenizer, "def fibonacci(n):")
    stream = engine.stream(ids, 16, temperature=0.7, seed=1, stop_on_eos=False)
    pieces = list(stream)
    assert sum(len(piece) for piece in pieces) == 16 == len(stream.result.tokens)
    assert all(0 <= token < target.config.vocab_size for token in stream.result.tokens)
