"""The developer tools' llama-server wait: a server that answers /health is waited for
(not longer), one that exits or never answers is reported as such, not waited on."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kamadev.llama_process import stop, wait_healthy


@dataclass
class Health:
    """A /health that answers 503 to its first `loading` asks, then 200, as
    llama-server loading (`loading=None`: loading for ever); it keeps the answers."""

    url: str
    answers: list[int] = field(default_factory=list)


@contextmanager
def health_after(loading: int | None) -> Iterator[Health]:
    health = Health(url="")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                loaded = loading is not None and len(health.answers) >= loading
                health.answers.append(200 if loaded else 503)
                self.send_response(health.answers[-1])
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    health.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield health
    finally:
        server.shutdown()


def sleeper(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_waits_until_healthy_and_no_longer() -> None:
    process = sleeper(30)
    try:
        with health_after(10) as health:
            wait_healthy(url=health.url, process=process, timeout_s=30, poll_s=0.05)
        # asked through the load, and not once more after the first 200
        assert health.answers == [503] * 10 + [200]
    finally:
        stop(process)
    assert process.returncode is not None


def test_a_server_that_exits_or_never_loads_is_reported() -> None:
    exited = sleeper(0)
    exited.wait()
    with health_after(None) as health, pytest.raises(RuntimeError, match="exited with 0"):
        wait_healthy(url=health.url, process=exited, timeout_s=10)
    assert health.answers == [], "waited on a server that had exited"
    stuck = sleeper(30)
    try:
        with (
            health_after(None) as health,
            pytest.raises(TimeoutError, match="did not become healthy"),
        ):
            wait_healthy(url=health.url, process=stuck, timeout_s=0.5, poll_s=0.05)
    finally:
        stop(stuck)
