"""`redwood chat`: a multi-turn conversation in the terminal on one engine, streamed.

Every turn sends the whole conversation through the tokenizer's chat template, as a chat UI
does; the engine's prompt cache (docs/design.md §5.5) keeps the KV of the part it has already
seen, so a turn runs only the new message (and whatever of the last answer re-tokenises
differently). After each answer one line says how fast it went and how many prompt tokens came
from the cache. An empty line or /exit (or end of input) ends the session.
"""
from __future__ import annotations

import sys
import time

from redwood.errors import RedwoodError

EXIT = ("/exit", "/quit")


def run_chat(config, params, system: str | None = None, method: str = "sequoia",
             read=input, write=print) -> int:
    """The conversation loop; read/write are the terminal (tests pass their own)."""
    from redwood.cli.textgen import attach_ngram_memory, load_engine
    from redwood.prompts import encode_chat, has_chat_template

    engine, tokenizer = load_engine(config, temperature=params.temperature)
    attach_ngram_memory(engine, 32768)           # n-gram drafts from earlier turns' answers
    if not has_chat_template(tokenizer):
        raise RedwoodError("this model's tokenizer has no chat template: use `redwood generate`")
    messages = [{"role": "system", "content": system}] if system else []
    write("redwood chat: an empty line or /exit ends the session", file=sys.stderr)
    while True:
        try:
            line = read("> ")
        except EOFError:
            break
        if not line.strip() or line.strip() in EXIT:
            break
        messages.append({"role": "user", "content": line})
        ids = encode_chat(tokenizer, messages)
        reply, result, seconds = _answer(engine, tokenizer, ids, params, method, write)
        messages.append({"role": "assistant", "content": reply})
        write(turn_line(result, len(ids), seconds), file=sys.stderr)
    return 0


def _answer(engine, tokenizer, ids, params, method, write):
    """Stream one answer; (its text, the GenerationResult, wall seconds)."""
    import torch

    from redwood.decode.detokenize import IncrementalText

    text = IncrementalText(tokenizer, list(params.stop))
    start = time.perf_counter()
    stream = engine.stream(torch.tensor(ids), params.max_new_tokens,
                           temperature=params.temperature, top_p=params.top_p,
                           top_k=params.top_k, seed=params.seed, method=method)
    try:
        for new_tokens in stream:
            piece = text.add(new_tokens)
            if piece:
                write(piece, end="", flush=True)
            if text.stopped:
                break
    finally:
        stream.close()
    rest = text.finish()
    write(rest)
    return text.text, stream.result, time.perf_counter() - start


def turn_line(result, prompt_tokens: int, seconds: float) -> str:
    """'  142 tokens in 5.80 s (24.5 tokens/s, whole turn), prompt 812 tokens (790 cached), 1.31
    tokens per target forward'."""
    n = len(result.tokens)
    cached = result.stats.cached_prompt_tokens
    return (f"  {n} tokens in {seconds:.2f} s ({n / seconds if seconds > 0 else 0.0:.1f} tokens/s, "
            f"whole turn), prompt {prompt_tokens} tokens ({cached} cached), "
            f"{result.tokens_per_step:.2f} tokens per target forward")
