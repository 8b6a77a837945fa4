"""Kama outlives its dependencies going away, as they do on real clusters: the API
server restarting (control-plane upgrades, managed clusters rotating it), etcd
restarting, and Temporal stalling (SIGSTOP: a partition or a stalled host) or being
killed and restarted — each in the middle of the suite, with the watcher, worker and
gateway processes left running. Afterwards scale, create, delete and routing still
work, and a first request that arrived during a Temporal outage is answered soon
after Temporal returns."""

from __future__ import annotations

import concurrent.futures
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import GatewayProcess
from tests.integration.runbook_shell import RUNBOOKS, run_runbook
from tests.integration.test_serving_plane import (
    SERVE_TIMEOUT,
    deployment,
    md,
    ready_artifact,
    serving_pods,
    wait_md_condition,
    wait_ready,
)
from tests.support import apply, eventually, kubectl

# how long after Temporal returns a held first request may take: the wake's retry
# back-off (at most 5 s) plus a cold start on this 2-core machine, with room for noise
ANSWERED_AFTER_RETURN_S = 60


def complete(gw: GatewayProcess, model: str, *, timeout: float = 60) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/v1/completions",
        json={"model": model, "prompt": "count", "max_tokens": 4, "ignore_eos": True},
        timeout=timeout,
    )


def routed_by(gw: GatewayProcess, model: str) -> str:
    try:
        response = complete(gw, model, timeout=30)
    except httpx.HTTPError as exc:
        return f"error:{type(exc).__name__}"
    return response.headers.get("x-kama-pod", "") if response.status_code == 200 else ""


def processes_alive(gw: GatewayProcess) -> None:
    control = gw.control
    for process in (control.watcher, control.second_watcher, control.worker, gw.process):
        process.check_alive()


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_scale_create_delete_and_routing_survive_a_control_plane_restart(
    gateway: GatewayProcess, namespace: str, tmp_path: Path, component: str
) -> None:
    gw, stack = gateway, gateway.control.stack
    ready_artifact(gw.control, namespace, tmp_path, name="model", seed=91, n_ctx=4096)
    apply(
        stack,
        deployment(
            namespace, "steady", "model",
            replicas=1, runtime={"contextSize": 512}, resources={"cpu": "100m"},
            scaling={"minReplicas": 0, "maxReplicas": 2, "idleTimeout": "1h"},
        ),
    )  # fmt: skip
    wait_ready(gw.control, namespace, "steady", 1)
    steady = f"{namespace}/steady"
    eventually(lambda: routed_by(gw, steady).startswith("steady-"), timeout=30, what="routing")

    stack.cluster.restart(component, down_for=5)
    processes_alive(gw)
    # the outages runbook's checks once the API server is back, as written
    said = run_runbook(
        stack, RUNBOOKS["outages"], "apiserver-back", {"NS": namespace, "GATEWAY_OPS": gw.ops_url}
    )
    assert said.startswith("ok") and "steady" in said, said

    # scale: the watcher still sees spec changes
    kubectl(stack, "scale", "modeldeployment", "steady", "-n", namespace, "--replicas=2")
    wait_ready(gw.control, namespace, "steady", 2)
    # create: a new deployment gets a status and the gateway routes to it
    apply(
        stack,
        deployment(
            namespace, "fresh", "model",
            replicas=1, runtime={"contextSize": 512}, resources={"cpu": "100m"},
            scaling={"idleTimeout": "1h"},
        ),
    )  # fmt: skip
    wait_ready(gw.control, namespace, "fresh", 1)
    fresh = f"{namespace}/fresh"
    eventually(
        lambda: routed_by(gw, fresh).startswith("fresh-"), timeout=30, what="routing to fresh"
    )
    # delete: its pods go and the gateway forgets the model
    kubectl(stack, "delete", "modeldeployment", "fresh", "-n", namespace, "--wait=false")
    eventually(
        lambda: not serving_pods(gw.control, namespace, "fresh"),
        timeout=SERVE_TIMEOUT,
        what="the deleted deployment's pods to go",
    )
    eventually(
        lambda: complete(gw, fresh, timeout=30).status_code == 404,
        timeout=30,
        what="the gateway to answer 404 for the deleted model",
    )
    # routing: both replicas of the surviving deployment take requests
    seen = {routed_by(gw, steady) for _ in range(12)}
    assert all(pod.startswith("steady-") for pod in seen), seen
    processes_alive(gw)
    ready = httpx.get(f"{gw.ops_url}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text


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
        returned = time.monotonic()
        response = first.result(timeout=ANSWERED_AFTER_RETURN_S + 30)
        answered_after = time.monotonic() - returned
    assert response.status_code == 200, response.text
    assert answered_after < ANSWERED_AFTER_RETURN_S, f"answered {answered_after:.0f}s after"
    said = run_runbook(stack, RUNBOOKS["outages"], "temporal-back", env)
    assert "SERVING" in said and f"deployment/{namespace}/{model.split('/')[1]}/" in said, said
    assert md(gw.control, namespace, model.split("/")[1])["spec"]["replicas"] == 1
    # and the model keeps answering
    assert complete(gw, model).status_code == 200
    processes_alive(gw)
