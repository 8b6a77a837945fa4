"""The developer tools' llama-server wait: a server that answers /health is waited for
(not longer), one that exits or never answers is reported as such, not waited on."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kamadev.llama_process import stop, wait_healthy


@contextmanager
def health_after(seconds: float) -> Iterator[str]:
    """A /health that answers 503 for `seconds`, then 200, as llama-server loading."""
    ready_at = time.monotonic() + seconds

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if time.monotonic() >= ready_at else 503)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def sleeper(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_waits_until_healthy_and_no_longer() -> None:
    process = sleeper(30)
    try:
        with health_after(0.5) as url:
            waited = wait_healthy(url=url, process=process, timeout_s=10, poll_s=0.05)
        assert 0.4 < waited < 2
    finally:
        stop(process)
    assert process.returncode is not None


def test_a_server_that_exits_or_never_loads_is_reported() -> None:
    exited = sleeper(0)
    exited.wait()
    with health_after(60) as url, pytest.raises(RuntimeError, match="exited with 0"):
        wait_healthy(url=url, process=exited, timeout_s=10)
    stuck = sleeper(30)
    try:
        with health_after(60) as url, pytest.raises(TimeoutError, match="did not become healthy"):
            wait_healthy(url=url, process=stuck, timeout_s=0.5, poll_s=0.05)
    finally:
        stop(stuck)
