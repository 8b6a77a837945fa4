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
from runtime.supervisor import LOADING_POLL_S, LOADING_WAIT_S, Supervisor
from tests.unit.stepped_clock import SteppedClock

HOST = "127.0.77.1"  # a loopback address of its own: LLAMA_PORT is fixed
LOAD_S = 0.3


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
def loading_llama_server(clock: SteppedClock) -> Iterator[None]:
    """Answers like llama-server that finishes loading LOAD_S after it started (on the
    supervisor's clock)."""
    started = clock.now()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            loaded = clock.now() - started >= LOAD_S
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


def stepped_supervisor(*, models_dir: Path, clock: SteppedClock) -> Supervisor:
    plan = ServingPlan(entrypoint="m.gguf", manifest_digest="0" * 64, ctx_total=512, concurrency=1)
    return Supervisor(
        plan=plan, host=HOST, llama_server="sleep", models_dir=models_dir, clock=clock
    )


@pytest.fixture
def supervisor(tmp_path: Path, clock: SteppedClock) -> Iterator[Supervisor]:
    found = stepped_supervisor(models_dir=tmp_path, clock=clock)
    found.child = subprocess.Popen(["sleep", "30"])  # llama-server's process, running
    yield found
    found.child.kill()
    found.child.wait()


@pytest.mark.usefixtures("loading_llama_server")
def test_a_probe_during_the_load_answers_ready_as_soon_as_it_is_loaded(
    supervisor: Supervisor,
) -> None:
    assert supervisor.ready()[0] is False, "still loading"
    asked = supervisor.clock.now()
    ok, why = supervisor.ready_when_loaded()
    waited = supervisor.clock.now() - asked
    assert ok, why
    assert LOAD_S <= waited < LOAD_S + LOADING_POLL_S, "ready at the first poll after the load"


@pytest.mark.usefixtures("loading_llama_server")
def test_a_loaded_or_draining_server_is_answered_at_once(
    supervisor: Supervisor, clock: SteppedClock
) -> None:
    supervisor.draining.set()
    assert supervisor.ready_when_loaded() == (False, "draining")
    assert clock.sleeps == [], "no wait while draining"
    supervisor.draining.clear()
    supervisor.was_ready = True  # it served before: an unready answer is news, not a load
    assert supervisor.ready_when_loaded()[0] is False
    assert clock.sleeps == [], "no wait once it has served"


def test_a_load_longer_than_the_wait_is_answered_within_the_probe_timeout(
    supervisor: Supervisor, clock: SteppedClock
) -> None:
    asked = clock.now()  # nothing listens: llama-server has not even bound yet
    ok, _ = supervisor.ready_when_loaded()
    assert not ok
    waited = clock.now() - asked
    assert LOADING_WAIT_S - LOADING_POLL_S <= waited <= LOADING_WAIT_S, "held for the whole wait"
    assert LOADING_WAIT_S < 1.0, "the kubelet's probe gives up at 1 s"


@pytest.mark.usefixtures("loading_llama_server")
def test_a_probe_during_the_artifact_check_waits_through_the_start(
    tmp_path: Path, clock: SteppedClock
) -> None:
    """The probe endpoint listens before the check: a probe then is held, not refused,
    and answers ready once the checked artifact's llama-server has loaded."""
    supervisor = stepped_supervisor(models_dir=tmp_path, clock=clock)
    assert supervisor.ready() == (False, "checking the artifact")
    assert supervisor.alive(), "a long check must not fail the liveness probe"

    class CheckedWhileHeld:
        """The artifact check ends (llama-server starts) while the probe is held."""

        def sleep(self, seconds: float) -> None:
            clock.sleep(seconds)
            if supervisor.child is None:
                supervisor.child = subprocess.Popen(["sleep", "30"])

        def now(self) -> float:
            return clock.now()

    supervisor.clock = CheckedWhileHeld()
    asked = clock.now()
    try:
        ok, why = supervisor.ready_when_loaded()
        assert ok, why
        assert clock.now() - asked < LOADING_WAIT_S, "ready within the probe's wait"
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
