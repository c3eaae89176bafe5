"""The server configurations `redwood bench --servers` can start, as command lines (a leaf: pure).

llama.cpp's own `llama-server` (built from the sources the pinned llama-cpp-python vendors, by
`make llama-server`) is the baseline CPU users run: plain, and its speculative modes as its
docs/speculative.md names them (chains only; the server drafts no trees). redwood's server
runs its default (batched) and its one-request-at-a-time drafters. Every server gets the same
GGUF files, the same thread count for one-token and batched decodes, the same context size and
one slot (a load test gives llama-server more: `ServerSetup.slots`), and listens on 127.0.0.1
only.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from redwood.errors import RedwoodError


@dataclass(frozen=True)
class ServerMethod:
    name: str
    kind: str                         # "llama-server" or "redwood"
    args: tuple[str, ...]             # beyond the common arguments of its kind
    description: str
    needs_draft: bool = False         # llama-server: pass the draft GGUF (-md)


METHODS = {m.name: m for m in (
    ServerMethod("llama-server", "llama-server", (), "llama-server, plain decoding (its defaults)"),
    ServerMethod("llama-server-again", "llama-server", (),
                 "llama-server, plain, a second instance (A/A: the bench's own noise floor)"),
    ServerMethod("llama-server-spec-default", "llama-server", ("--spec-default",),
                 "llama-server --spec-default (ngram-mod: n-match 24, n-min 48, n-max 64)"),
    ServerMethod("llama-server-ngram-map-k", "llama-server", ("--spec-type", "ngram-map-k"),
                 "llama-server --spec-type ngram-map-k"),
    ServerMethod("llama-server-ngram-simple", "llama-server", ("--spec-type", "ngram-simple"),
                 "llama-server --spec-type ngram-simple"),
    ServerMethod("llama-server-draft", "llama-server", ("--spec-type", "draft-simple"),
                 "llama-server -md DRAFT --spec-type draft-simple (its defaults)", True),
    ServerMethod("llama-server-draft-p75", "llama-server",
                 ("--spec-type", "draft-simple", "--spec-draft-p-min", "0.75"),
                 "llama-server -md DRAFT --spec-type draft-simple --spec-draft-p-min 0.75", True),
    ServerMethod("redwood", "redwood", (), "redwood serve (its defaults: continuous batching)"),
    ServerMethod("redwood-ngram-batched", "redwood", ("--drafter", "ngram"),
                 "redwood serve --drafter ngram (continuous batching, prompt-lookup drafts)"),
    ServerMethod("redwood-plain", "redwood", ("--method", "autoregressive"),
                 "redwood serve --method autoregressive (continuous batching, no drafts)"),
    ServerMethod("redwood-batch1", "redwood", ("--max-batch", "1"),
                 "redwood serve --max-batch 1 (the shipped bundle, governed)"),
    ServerMethod("redwood-ngram", "redwood", ("--max-batch", "1", "--drafter", "ngram"),
                 "redwood serve --max-batch 1 --drafter ngram"),
    ServerMethod("redwood-ngram-request", "redwood",
                 ("--max-batch", "1", "--drafter", "ngram", "--ngram-memory", "0"),
                 "redwood serve --max-batch 1 --drafter ngram --ngram-memory 0 (the request's "
                 "own text only)"),
    ServerMethod("redwood-auto", "redwood", ("--max-batch", "1", "--drafter", "auto"),
                 "redwood serve --max-batch 1 --drafter auto"),
)}
BASELINE = "llama-server"


def check_methods(names) -> list[ServerMethod]:
    """The methods by name, the baseline first (added when missing); RedwoodError on an
    unknown or repeated name."""
    names = list(names)
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise RedwoodError(f"unknown server method(s) {', '.join(unknown)}; choose from "
                           f"{', '.join(METHODS)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise RedwoodError(f"server method(s) given twice: {', '.join(repeated)}")
    ordered = [BASELINE] + [n for n in names if n != BASELINE]
    return [METHODS[n] for n in ordered]


@dataclass(frozen=True)
class ServerSetup:
    """What every server of a run shares."""
    target: str                       # GGUF paths
    draft: str
    threads: int
    n_ctx: int = 4096
    llama_server: str | None = None   # the llama-server binary
    redwood_model_args: tuple[str, ...] = ()   # () = the shipped pair (and its bundles)
    slots: int = 1                    # llama-server -np (n_ctx is shared by the slots)


def command(method: ServerMethod, setup: ServerSetup, port: int) -> list[str]:
    """The argv that starts `method` listening on 127.0.0.1:port."""
    if method.kind == "llama-server":
        if not setup.llama_server:
            raise RedwoodError("no llama-server binary: run `make llama-server` (builds it from "
                               "the pinned llama-cpp-python's sources) or pass --llama-server PATH")
        argv = [setup.llama_server, "-m", setup.target, "-t", str(setup.threads),
                "-tb", str(setup.threads), "-c", str(setup.n_ctx), "-np", str(setup.slots),
                "--host", "127.0.0.1", "--port", str(port)]
        if method.needs_draft:
            argv += ["-md", setup.draft, "-td", str(setup.threads), "-tbd", str(setup.threads)]
        return argv + list(method.args)
    return [sys.executable, "-m", "redwood.cli", "serve", *setup.redwood_model_args,
            "--host", "127.0.0.1", "--port", str(port), *method.args]
