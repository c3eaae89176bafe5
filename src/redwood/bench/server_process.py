"""A benchmark's server processes: start one on a free loopback port, wait until it answers
/health, stop it. Its output goes to a log file, whose tail is quoted when it fails to start."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from redwood.bench.http_client import get_json
from redwood.errors import RedwoodError


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One running server. `start()` returns once GET /health answers 200 (llama-server answers
    503 while it loads), or raises RedwoodError with the log's tail if the process exits or
    `startup_timeout` passes. Use as a context manager so the process always ends."""

    def __init__(self, name: str, argv: list[str], port: int, log_path: Path,
                 startup_timeout: float = 900.0, env: dict | None = None):
        self.name, self.argv, self.port = name, list(argv), int(port)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path, self.startup_timeout = Path(log_path), float(startup_timeout)
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None
        self.started_seconds = 0.0

    def start(self, progress=None) -> "ServerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        start = time.perf_counter()
        try:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env)
        except OSError as err:
            log.close()
            raise RedwoodError(f"could not start {self.name} ({self.argv[0]}): {err}") from None
        log.close()
        next_note = start + 30.0
        while True:
            if self.process.poll() is not None:
                raise RedwoodError(f"{self.name} exited with code {self.process.returncode} "
                                   f"while starting; its log ({self.log_path}) ends:\n"
                                   f"{self.log_tail()}")
            status, _ = get_json(self.url, "/health", timeout=2.0)
            if status == 200:
                self.started_seconds = time.perf_counter() - start
                return self
            now = time.perf_counter()
            if now - start > self.startup_timeout:
                self.stop()
                raise RedwoodError(f"{self.name} did not answer /health within "
                                   f"{self.startup_timeout:.0f} s; its log ends:\n{self.log_tail()}")
            if progress is not None and now >= next_note:
                progress(f"  still waiting for {self.name} ({now - start:.0f} s; a first use "
                         "measures this machine's profile)")
                next_note = now + 30.0
            time.sleep(0.25)

    def pause(self) -> None:
        """SIGSTOP: an idle server takes no CPU at all (no poll loop, no spinning thread pool)
        while another one is timed; resume() lets it go on exactly where it was."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGCONT)            # a paused process cannot terminate
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
