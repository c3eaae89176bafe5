"""A stub OpenAI-compatible completion server for the server benchmark's tests: /health and
/v1/completions (plain and streamed), answering `tokens` tokens after `delay` seconds per token.
Run as a script (python stub_openai.py PORT DELAY [TOKENS] [HEALTHY_AFTER]) or in a thread."""
from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def make_handler(delay: float, tokens: int, healthy_after: float = 0.0, seen: list | None = None):
    born = time.perf_counter()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _json(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                ready = time.perf_counter() - born >= healthy_after
                self._json(200 if ready else 503, {"status": "ok" if ready else "loading"})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if seen is not None:
                seen.append(body)
            if self.path != "/v1/completions" or not isinstance(body.get("prompt"), list):
                self._json(400, {"error": {"message": "prompt must be token ids"}})
                return
            n = min(tokens, int(body.get("max_tokens", tokens)))
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}
            if not body.get("stream"):
                time.sleep(delay * n)
                self._json(200, {"choices": [{"text": "x" * n, "finish_reason": "stop"}],
                                 "usage": usage, "timings": {"draft_n": 4, "draft_n_accepted": 3}})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(n):
                time.sleep(delay)
                chunk = {"choices": [{"text": "x", "finish_reason": "stop" if i == n - 1 else None}]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode()
                             + b"\n\ndata: [DONE]\n\n")
    return Handler


def serve_in_thread(delay: float, tokens: int = 8, seen: list | None = None):
    """(server, url) on a free loopback port; call server.shutdown() when done."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(delay, tokens, seen=seen))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


if __name__ == "__main__":
    port, delay = int(sys.argv[1]), float(sys.argv[2])
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    healthy_after = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    ThreadingHTTPServer(("127.0.0.1", port), make_handler(delay, tokens, healthy_after)).serve_forever()
