"""The serving pod's drain on SIGTERM: llama-server is stopped once no slot is
processing, or at the plan's drain timeout; a `/slots` that does not answer (a
llama-server busy generating on a loaded node) is not taken for an idle one, so a
request in flight is not cut off."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kama.serving_plan import LLAMA_PORT, ServingPlan
from runtime.supervisor import Supervisor

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
    found = Supervisor(plan=plan, host=HOST, llama_server="sleep", models_dir=tmp_path)
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
            data = json.dumps([{"id": 0, "is_processing": processing}]).encode()
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
    """Seconds `drain_and_stop` took; llama-server's process is stopped after it."""
    started = time.monotonic()
    supervisor.drain_and_stop()
    took = time.monotonic() - started
    assert supervisor.child is not None and supervisor.child.poll() is not None
    return took


def test_a_slots_endpoint_that_does_not_answer_is_waited_for_until_the_drain_timeout(
    supervisor: Supervisor,
) -> None:
    """Nothing answers on llama-server's port, its process runs: the drain does not
    know that no request is in flight, so it waits, up to the plan's timeout."""
    assert supervisor.busy_slots() is None, "no answer is not an idle server"
    assert drained(supervisor) >= DRAIN_TIMEOUT_S


def test_the_drain_ends_as_soon_as_no_slot_is_processing(
    supervisor: Supervisor, slots_answers: list[bool]
) -> None:
    slots_answers.extend([True, True])
    took = drained(supervisor)
    assert not slots_answers, "asked until a slot was free"
    assert took < DRAIN_TIMEOUT_S, f"stopped {took:.2f} s after SIGTERM, not at the timeout"
