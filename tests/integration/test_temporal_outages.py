"""Kama outlives Temporal going away: stalled (SIGSTOP: a partition or a stalled host)
or killed and restarted, with the watcher, worker and gateway processes left running.
A first request for a model at zero that arrives during the outage is held, shows in
the outages runbook's checks, and is answered soon after Temporal returns.
(The control plane's outages: test_control_plane_outages.py.)"""

from __future__ import annotations

import concurrent.futures
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import GatewayProcess
from tests.integration.outage_checks import complete, processes_alive
from tests.integration.runbook_shell import RUNBOOKS, run_runbook
from tests.integration.test_serving_plane import (
    deployment,
    md,
    ready_artifact,
    wait_md_condition,
)
from tests.support import apply, eventually

# how long after Temporal returns a held first request may take: the wake's retry
# back-off (at most 5 s) plus a cold start on this 2-core machine, with room for noise
ANSWERED_AFTER_RETURN_S = 60


def cold_model(gw: GatewayProcess, namespace: str, tmp_path: Path, name: str, seed: int) -> str:
    ready_artifact(gw.control, namespace, tmp_path, name=f"{name}-model", seed=seed, n_ctx=4096)
    apply(
        gw.control.stack,
        deployment(
            namespace, name, f"{name}-model",
            runtime={"contextSize": 512}, resources={"cpu": "100m"},
            scaling={"coldStartTimeout": "3m", "idleTimeout": "1h"},
        ),
    )  # fmt: skip
    wait_md_condition(gw.control, namespace, name, "ScaledToZero")
    model = f"{namespace}/{name}"
    eventually(
        lambda: any(
            m["id"] == model for m in httpx.get(f"{gw.url}/v1/models", timeout=10).json()["data"]
        ),
        timeout=30,
        what="the gateway to know the model",
    )
    return model


@pytest.mark.parametrize("outage", ["frozen", "killed"])
def test_a_cold_start_during_a_temporal_outage_is_answered_once_temporal_returns(
    gateway: GatewayProcess, namespace: str, tmp_path: Path, outage: str
) -> None:
    gw, stack = gateway, gateway.control.stack
    temporal = stack.temporal_server
    model = cold_model(
        gw, namespace, tmp_path, f"cold-{outage}", seed=93 if outage == "frozen" else 94
    )
    env = {"NS": namespace, "NAME": model.split("/")[1], "GATEWAY_OPS": gw.ops_url}

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        if outage == "frozen":
            temporal.freeze()
        else:
            temporal.kill()
        try:
            first = pool.submit(complete, gw, model, timeout=240)
            away = time.monotonic()
            time.sleep(5)  # the request arrives and waits while Temporal is away
            # the outages runbook's checks while Temporal is away, as written
            said = run_runbook(stack, RUNBOOKS["outages"], "temporal-down", env)
            assert "Temporal: no answer" in said, said
            assert re.search(r"^kama_gateway_queued\{[^}]*\} [1-9]", said, re.M), said
            time.sleep(max(0.0, 20 - (time.monotonic() - away)))
            assert not first.done(), "answered while Temporal was away?"
        finally:
            if outage == "frozen":
                temporal.thaw()
            else:
                temporal.restart()
        # answered once Temporal is back: waited for, at most ANSWERED_AFTER_RETURN_S
        response = first.result(timeout=ANSWERED_AFTER_RETURN_S)
    assert response.status_code == 200, response.text
    said = run_runbook(stack, RUNBOOKS["outages"], "temporal-back", env)
    assert "SERVING" in said and f"deployment/{namespace}/{model.split('/')[1]}/" in said, said
    assert md(gw.control, namespace, model.split("/")[1])["spec"]["replicas"] == 1
    # and the model keeps answering
    assert complete(gw, model).status_code == 200
    processes_alive(gw)
