"""The serving pod's probe port is reachable by other pods (in the default
cluster-wide mode, any pod's): connections that send nothing are dropped after the
handler timeout, and the handler threads are capped, so idle or slow connections can
neither grow the runtime's threads without bound nor hold its probes for long."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kama.serving_plan import SUPERVISOR_PORT, ServingPlan
from runtime import supervisor as supervisor_module
from runtime.probe_socket import listen_for_probes
from runtime.supervisor import Supervisor
from tests.support import eventually

HOST = "127.0.77.3"  # a loopback address of its own: SUPERVISOR_PORT is fixed
CAP = 4


@pytest.fixture
def probe_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(supervisor_module, "PROBE_HANDLER_THREADS", CAP)
    monkeypatch.setattr(supervisor_module, "PROBE_HANDLER_TIMEOUT_S", 0.3)
    plan = ServingPlan(entrypoint="m.gguf", manifest_digest="0" * 64, ctx_total=512, concurrency=1)
    found = Supervisor(plan=plan, host=HOST, llama_server="sleep", models_dir=tmp_path)
    listener = listen_for_probes(host=HOST)
    server = found.serve_probes(listener)
    yield
    server.shutdown()
    listener.close()


def handler_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("Thread-"))


def livez() -> bytes:
    with socket.create_connection((HOST, SUPERVISOR_PORT), timeout=5) as probe:
        probe.sendall(b"GET /livez HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n")
        return b"".join(iter(lambda: probe.recv(4096), b""))


@pytest.mark.usefixtures("probe_server")
def test_idle_connections_are_capped_and_dropped() -> None:
    before = handler_threads()
    idle = [socket.create_connection((HOST, SUPERVISOR_PORT), timeout=5) for _ in range(3 * CAP)]
    try:
        eventually(
            lambda: handler_threads() - before >= CAP, timeout=10, what="handlers up to the cap"
        )
        assert handler_threads() - before == CAP, "no more handler threads than the cap"
        for connection in idle:  # each is dropped: refused past the cap, or timed out
            assert connection.recv(1) == b""
        eventually(lambda: handler_threads() <= before, timeout=10, what="the handlers gone")
        assert livez().startswith(b"HTTP/1.0 200"), "the probes are answered again"
    finally:
        for connection in idle:
            connection.close()
