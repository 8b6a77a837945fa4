"""The serving pod's readiness while llama-server loads: a probe that arrives during
the load, or earlier while the artifact is still checked, waits (a little, under the
kubelet's probe timeout) and answers ready as soon as llama-server serves, so a new
replica is Ready at that probe rather than a probe period later; once loaded, or while
draining, probes answer at once. The pod is live while its artifact is checked."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kama.serving_plan import LLAMA_PORT, SUPERVISOR_PORT, ServingPlan
from runtime.probe_socket import listen_for_probes
from runtime.supervisor import LOADING_WAIT_S, Supervisor

HOST = "127.0.77.1"  # a loopback address of its own: LLAMA_PORT is fixed
LOAD_S = 0.3


@pytest.fixture
def loading_llama_server() -> Iterator[None]:
    """Answers like llama-server that finishes loading LOAD_S after it started."""
    started = time.monotonic()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            loaded = time.monotonic() - started >= LOAD_S
            body: dict[str, Any] = {"status": "ok" if loaded else "loading model"}
            if self.path == "/props":
                body = {"total_slots": 1, "model_path": "/models/m.gguf"}
            self.send_response(200 if loaded else 503)
            data = json.dumps(body).encode()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer((HOST, LLAMA_PORT), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield
    server.shutdown()
    server.server_close()


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    plan = ServingPlan(entrypoint="m.gguf", manifest_digest="0" * 64, ctx_total=512, concurrency=1)
    found = Supervisor(plan=plan, host=HOST, llama_server="sleep", models_dir=tmp_path)
    found.child = subprocess.Popen(["sleep", "30"])  # llama-server's process, running
    yield found
    found.child.kill()
    found.child.wait()


@pytest.mark.usefixtures("loading_llama_server")
def test_a_probe_during_the_load_answers_ready_as_soon_as_it_is_loaded(
    supervisor: Supervisor,
) -> None:
    assert supervisor.ready()[0] is False, "still loading"
    asked = time.monotonic()
    ok, why = supervisor.ready_when_loaded()
    waited = time.monotonic() - asked
    assert ok, why
    assert waited < LOADING_WAIT_S, f"answered {waited:.2f}s after the probe"


@pytest.mark.usefixtures("loading_llama_server")
def test_a_loaded_or_draining_server_is_answered_at_once(supervisor: Supervisor) -> None:
    supervisor.draining.set()
    asked = time.monotonic()
    assert supervisor.ready_when_loaded() == (False, "draining")
    assert time.monotonic() - asked < 0.1
    supervisor.draining.clear()
    supervisor.was_ready = True  # it served before: an unready answer is news, not a load
    asked = time.monotonic()
    assert supervisor.ready_when_loaded()[0] is False
    assert time.monotonic() - asked < 0.2


def test_a_load_longer_than_the_wait_is_answered_within_the_probe_timeout(
    supervisor: Supervisor,
) -> None:
    asked = time.monotonic()  # nothing listens: llama-server has not even bound yet
    ok, _ = supervisor.ready_when_loaded()
    assert not ok and time.monotonic() - asked < 1.0, "the kubelet's probe gives up at 1 s"


@pytest.mark.usefixtures("loading_llama_server")
def test_a_probe_during_the_artifact_check_waits_through_the_start(tmp_path: Path) -> None:
    """The probe endpoint listens before the check: a probe then is held, not refused,
    and answers ready once the checked artifact's llama-server has loaded."""
    plan = ServingPlan(entrypoint="m.gguf", manifest_digest="0" * 64, ctx_total=512, concurrency=1)
    supervisor = Supervisor(plan=plan, host=HOST, llama_server="sleep", models_dir=tmp_path)
    assert supervisor.ready() == (False, "checking the artifact")
    assert supervisor.alive(), "a long check must not fail the liveness probe"

    def checked_then_started() -> None:
        time.sleep(0.1)
        supervisor.child = subprocess.Popen(["sleep", "30"])

    threading.Thread(target=checked_then_started, daemon=True).start()
    asked = time.monotonic()
    try:
        ok, why = supervisor.ready_when_loaded()
        assert ok, why
        assert time.monotonic() - asked < LOADING_WAIT_S
        assert supervisor.alive()
    finally:
        assert supervisor.child is not None
        supervisor.child.kill()
        supervisor.child.wait()
    assert not supervisor.alive(), "llama-server gone: not live"


@pytest.mark.usefixtures("loading_llama_server")
def test_a_probe_that_comes_before_the_supervisor_runs_is_held_not_refused(
    supervisor: Supervisor,
) -> None:
    """`kama runtime` binds the probe port before it imports the supervisor: a readiness
    probe that connects in between waits in the port's backlog and is answered by the
    supervisor once it serves, here ready as soon as llama-server has loaded (the
    kubelet would otherwise send the next probe a period later)."""
    listener = listen_for_probes(host=HOST)
    probe = socket.create_connection((HOST, SUPERVISOR_PORT), timeout=LOADING_WAIT_S + 1)
    server = None
    try:
        probe.sendall(b"GET /readyz HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n")
        time.sleep(0.1)  # the supervisor's own start, still importing
        server = supervisor.serve_probes(listener)
        answer = b"".join(iter(lambda: probe.recv(4096), b""))
    finally:
        probe.close()
        if server is not None:
            server.shutdown()
        listener.close()
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.0 200"), answer
    assert json.loads(body) == {"ok": True, "reason": "ready"}
