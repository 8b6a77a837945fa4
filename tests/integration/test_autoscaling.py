"""Built-in autoscaling on the local stack, through the gateway with the real
`openai` client and real llama-server replicas: a load above one replica's slots
scales a deployment 1 → 3 once the scale-up window has passed; when the load drops
it comes back down one replica per stabilisation window to what is still in use and
to zero after idleTimeout — and not one request fails on the way, streams included
(each drain waits for the gateway's requests to the leaving pod)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import openai

from tests.conftest import GatewayProcess
from tests.integration.test_gateway import client, scale_events, serve
from tests.integration.test_serving_plane import SERVE_TIMEOUT, md, serving_pods, wait_ready
from tests.support import eventually, kubectl

SCALE_UP_WINDOW_S = 10


class LoadLoop:
    """`workers` clients each sending one request after another (every other one
    streamed) until stopped; every failure is kept."""

    def __init__(self, api: openai.OpenAI, model: str, *, workers: int, max_tokens: int) -> None:
        self.api, self.model, self.max_tokens = api, model, max_tokens
        self.stop = threading.Event()
        self.answered = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(workers)
        ]

    def __enter__(self) -> LoadLoop:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def _run(self, worker: int) -> None:
        turn = 0
        while not self.stop.is_set():
            turn += 1
            try:
                self._one(stream=(worker + turn) % 2 == 0)
                with self._lock:
                    self.answered += 1
            except Exception as exc:
                with self._lock:
                    self.failures.append(f"{type(exc).__name__}: {exc}")

    def _one(self, *, stream: bool) -> None:
        messages: Any = [{"role": "user", "content": "count to ten"}]
        if stream:
            chunks = list(
                self.api.chat.completions.create(
                    model=self.model, messages=messages, max_tokens=self.max_tokens, stream=True
                )
            )
            assert chunks and chunks[-1].choices[0].finish_reason, "a stream ended early"
        else:
            reply = self.api.chat.completions.create(
                model=self.model, messages=messages, max_tokens=self.max_tokens
            )
            assert reply.choices[0].finish_reason, "an answer without a finish reason"


def test_load_scales_up_then_back_down_to_zero_without_a_failed_request(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    gw = gateway
    serve(
        gw, namespace, tmp_path, "elastic", 81,
        replicas=1, runtime={"contextSize": 2048, "concurrency": 1}, resources={"cpu": "100m"},
        scaling={"minReplicas": 0, "maxReplicas": 3, "targetUtilizationPercent": 100,
                 "scaleUpWindow": f"{SCALE_UP_WINDOW_S}s",
                 "scaleDownWindow": "15s", "idleTimeout": "20s", "drainTimeout": "60s"},
    )  # fmt: skip
    wait_ready(gw.control, namespace, "elastic", 1)
    api, model = client(gw), f"{namespace}/elastic"
    columns = kubectl(gw.control.stack, "get", "md", "elastic", "-n", namespace).stdout
    assert "DESIRED" in columns and "MAX" in columns

    # 4 clients on one slot a replica: demand 4 wants 4 replicas at 100 %, max 3
    with LoadLoop(api, model, workers=4, max_tokens=48) as heavy:
        # not before the scale-up window: one replica all through its first part (a
        # busy machine only delays a scale-up, so this cannot fail for being slow)
        held_at_one = time.monotonic() + SCALE_UP_WINDOW_S - 2
        while time.monotonic() < held_at_one:
            replicas = md(gw.control, namespace, "elastic")["spec"]["replicas"]
            assert replicas == 1, f"scaled to {replicas} within the {SCALE_UP_WINDOW_S} s window"
            time.sleep(0.5)
        eventually(
            lambda: md(gw.control, namespace, "elastic")["spec"]["replicas"] == 3,
            timeout=90,
            what="spec.replicas 1 -> 3 under load",
        )
        wait_ready(gw.control, namespace, "elastic", 3)
        answered_at_three = heavy.answered
        eventually(
            lambda: heavy.answered >= answered_at_three + 12,
            timeout=120,
            what="requests answered by three replicas",
        )
    assert heavy.failures == [], heavy.failures
    served_by = {
        p["metadata"]["name"]
        for p in serving_pods(gw.control, namespace, "elastic")
        if p.get("status", {}).get("phase") == "Running"
    }
    assert len(served_by) >= 3

    # one streaming client left: down one replica per window to the one it uses
    with LoadLoop(api, model, workers=1, max_tokens=96) as light:
        eventually(
            lambda: md(gw.control, namespace, "elastic")["spec"]["replicas"] == 1,
            timeout=240,
            what="3 -> 1 while one client is still sending",
        )
        eventually(
            lambda: len(serving_pods(gw.control, namespace, "elastic")) == 1,
            timeout=120,
            what="the drained replicas gone",
        )
        answered = light.answered
        eventually(lambda: light.answered >= answered + 2, timeout=60, what="still answered at one")
    assert light.failures == [], f"a request failed during a scale-down: {light.failures}"
    messages = scale_events(gw, namespace, "elastic")
    assert any("want 3 replicas" in m for m in messages), messages
    # the autoscaler's own account: demand held through the window (workflow time)
    assert any(f"for {SCALE_UP_WINDOW_S}s want 3 replicas" in m for m in messages), messages
    assert sum("want 1 replicas" in m or "want 2 replicas" in m for m in messages) >= 2, messages

    # no request at all: zero after idleTimeout
    eventually(
        lambda: (
            md(gw.control, namespace, "elastic")["spec"]["replicas"] == 0
            and not serving_pods(gw.control, namespace, "elastic")
        ),
        timeout=SERVE_TIMEOUT,
        what="idle scale to zero",
    )
    assert any("idleTimeout" in m for m in scale_events(gw, namespace, "elastic"))
