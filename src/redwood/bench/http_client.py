"""One HTTP client for every server a benchmark compares (llama-server, redwood serve, anything
OpenAI-compatible): the same request body, the same socket code, the same clock.

`complete(base_url, body)` POSTs to /v1/completions and times the whole request on the client
(connect, prefill, decode, the response): the end-to-end figure of docs/design.md §9. Streamed
(`"stream": true` in the body), it also records the time to the first chunk that carries text,
and reads the token count from the final usage chunk (`stream_options.include_usage`).
Standard library only (http.client), so the client costs the same for every server.
"""
from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from redwood.errors import RedwoodError


@dataclass
class Reply:
    """One completed request as the client saw it."""
    wall_seconds: float                    # request sent -> last byte read
    text: str
    completion_tokens: int | None          # the server's usage figure
    prompt_tokens: int | None
    finish_reason: str | None
    ttft_seconds: float | None = None      # streamed requests: to the first text chunk
    extra: dict = field(default_factory=dict)   # llama-server "timings", redwood "redwood", usage


def _connection(base_url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise RedwoodError(f"server URL must be http://HOST:PORT, got {base_url!r}")
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)


def get_json(base_url: str, path: str, timeout: float = 5.0) -> tuple[int, dict | None]:
    """(status, JSON body or None) of a GET; (0, None) when nothing answers."""
    try:
        conn = _connection(base_url, timeout)
        conn.request("GET", path)
        response = conn.getresponse()
        raw = response.read()
        conn.close()
    except (OSError, http.client.HTTPException):
        return 0, None
    try:
        return response.status, json.loads(raw or b"null")
    except ValueError:
        return response.status, None


def complete(base_url: str, body: dict, timeout: float = 600.0) -> Reply:
    """POST body to base_url/v1/completions; RedwoodError on a non-200 answer."""
    conn = _connection(base_url, timeout)
    payload = json.dumps(body).encode()
    start = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", payload, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            detail = response.read()[:500].decode(errors="replace")
            raise RedwoodError(f"{base_url}/v1/completions answered HTTP {response.status}: "
                               f"{detail}")
        if body.get("stream"):
            return _read_stream(response, start)
        data = json.loads(response.read())
    except (OSError, http.client.HTTPException) as err:
        raise RedwoodError(f"request to {base_url}/v1/completions failed: {err}") from None
    finally:
        conn.close()
    wall = time.perf_counter() - start
    choice = (data.get("choices") or [{}])[0]
    usage = data.get("usage") or {}
    return Reply(wall, choice.get("text", ""), usage.get("completion_tokens"),
                 usage.get("prompt_tokens"), choice.get("finish_reason"), None,
                 _extras(data))


def _read_stream(response, start: float) -> Reply:
    """Server-sent events: `data: {json}` lines until `data: [DONE]` (or the end)."""
    text, ttft, finish, last = [], None, None, {}
    usage: dict = {}
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        event = json.loads(data)
        last = event
        usage = event.get("usage") or usage
        for choice in event.get("choices") or []:
            piece = choice.get("text") or ""
            if piece and ttft is None:
                ttft = time.perf_counter() - start
            text.append(piece)
            finish = choice.get("finish_reason") or finish
    wall = time.perf_counter() - start
    extra = _extras(last)
    extra["usage"] = usage
    return Reply(wall, "".join(text), usage.get("completion_tokens"), usage.get("prompt_tokens"),
                 finish, ttft, extra)


def _extras(data: dict) -> dict:
    """What servers add beside the OpenAI fields: llama-server's "timings" (prompt_n,
    predicted_n, draft_n, draft_n_accepted, ...) and redwood's "redwood" stats."""
    return {key: data[key] for key in ("timings", "redwood", "usage") if key in data}
