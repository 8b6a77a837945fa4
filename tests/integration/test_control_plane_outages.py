"""Kama outlives its control plane restarting, as it does on real clusters (control-plane
upgrades, managed clusters rotating the API server): the API server or etcd restarts in
the middle of the suite, with the watcher, worker and gateway processes left running.
Afterwards scale, create, delete and routing still work, and the outages runbook's
checks say so. (Temporal's outages: test_temporal_outages.py.)"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import GatewayProcess
from tests.integration.outage_checks import complete, processes_alive, routed_by
from tests.integration.runbook_shell import RUNBOOKS, run_runbook
from tests.integration.test_serving_plane import (
    SERVE_TIMEOUT,
    deployment,
    ready_artifact,
    serving_pods,
    wait_ready,
)
from tests.support import apply, eventually, kubectl


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
