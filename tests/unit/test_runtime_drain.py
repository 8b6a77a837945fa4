"""The serving pod's drain on SIGTERM: llama-server is stopped once no slot is
processing, or at the plan's drain timeout; a `/slots` that does not answer (a
llama-server busy generating on a loaded node) is not taken for an idle one, so a
request in flight is not cut off."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kama.serving_plan import LLAMA_PORT, ServingPlan
from runtime.supervisor import DRAIN_POLL_S, DRAIN_QUIET_S, Supervisor
from tests.unit.stepped_clock import SteppedClock

HOST = "127.0.77.2"  # a loopback address of its own: LLAMA_PORT is fixed
DRAIN_TIMEOUT_S = 3.0


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    plan = ServingPlan(
        entrypoint="m.gguf",
        manifest_digest="0" * 64,
        ctx_total=512,
        concurrency=1,
        drain_timeout_s=DRAIN_TIMEOUT_S,
    )
    found = Supervisor(
        plan=plan, host=HOST, llama_server="sleep", models_dir=tmp_path, clock=SteppedClock()
    )
    found.child = subprocess.Popen(["sleep", "30"])  # llama-server's process, running
    yield found
    found.child.kill()
    found.child.wait()


@pytest.fixture
def slots_answers() -> Iterator[list[bool]]:
    """A llama-server whose `/slots` answers, in turn, each of the list's values
    (a slot processing or not), then idle."""
    answers: list[bool] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            processing = answers.pop(0) if answers else False
            slot = {"id": 0, "is_processing": processing, "next_token": [{"n_decoded": 7}]}
            data = json.dumps([slot, {"id": 1, "is_processing": False}]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer((HOST, LLAMA_PORT), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield answers
    server.shutdown()
    server.server_close()


def drained(supervisor: Supervisor) -> float:
    """Seconds `drain_and_stop` waited on the supervisor's (stepped) clock;
    llama-server's process is stopped after it."""
    started = supervisor.clock.now()
    supervisor.drain_and_stop()
    assert supervisor.child is not None and supervisor.child.poll() is not None
    return supervisor.clock.now() - started


def test_a_slots_endpoint_that_does_not_answer_is_waited_for_until_the_drain_timeout(
    supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing answers on llama-server's port, its process runs: the drain does not
    know that no request is in flight, so it waits, up to the plan's timeout, and the
    pod's log says the timeout ended it."""
    assert supervisor.busy_slots() is None, "no answer is not an idle server"
    with caplog.at_level("INFO", logger="kama.runtime"):
        assert drained(supervisor) == DRAIN_TIMEOUT_S
    assert "drain timeout (3 s) reached, /slots did not answer" in caplog.text


def test_the_drain_ends_as_soon_as_no_slot_is_processing(
    supervisor: Supervisor, slots_answers: list[bool], caplog: pytest.LogCaptureFixture
) -> None:
    slots_answers.extend([True, True])
    with caplog.at_level("INFO", logger="kama.runtime"):
        waited = drained(supervisor)
    assert not slots_answers, "asked until a slot was free"
    assert waited == 2 * DRAIN_POLL_S + DRAIN_QUIET_S, "stopped once idle, not at the timeout"
    assert caplog.text.count("draining: 1 slot(s) processing, 7 tokens generated") == 2
    assert "drained: no slot processing 2.0 s after SIGTERM" in caplog.text


def test_a_request_that_comes_just_after_an_idle_reading_is_waited_for(
    supervisor: Supervisor, slots_answers: list[bool]
) -> None:
    """A request the gateway routed before it saw the pod go (it learns of the deletion
    when the kubelet does) reaches llama-server after the drain's first reading: one
    idle reading is not an idle server, no slot may be busy for DRAIN_QUIET_S."""
    slots_answers.extend([False, True, True])
    waited = drained(supervisor)
    assert not slots_answers, "the request that came after the first idle reading was seen"
    assert waited == 3 * DRAIN_POLL_S + DRAIN_QUIET_S
