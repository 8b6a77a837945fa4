"""KEDA mode on the local stack, through a real KEDA operator and metrics adapter
(built from Go modules) and the controller-manager's HPA: a ModelDeployment with
`spec.scaling.autoscaler: KEDA` gets a ScaledObject from Kama; a load loop through the
gateway (real `openai` client, real llama-server replicas) takes it 0 → 2 (KEDA
activates it from the gateway's external scaler, its HPA adds the second replica on
the `kama-demand` metric), and when the load stops it goes back to zero, with not one
failed request and not one replica decision of Kama's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kamadev.keda import LocalKeda
from tests.conftest import GatewayProcess
from tests.integration.test_autoscaling import LoadLoop
from tests.integration.test_gateway import client, scale_events, serve
from tests.integration.test_serving_plane import SERVE_TIMEOUT, md, serving_pods, wait_ready
from tests.support import eventually, kubectl


def get_json(gw: GatewayProcess, *args: str) -> dict[str, Any] | None:
    """The object as JSON, None while it does not exist."""
    result = kubectl(gw.control.stack, "get", *args, "-o", "json", check=False)
    if result.returncode != 0:
        return None
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def scaled_object_ready(gw: GatewayProcess, namespace: str, name: str) -> bool:
    found = get_json(gw, "scaledobject", name, "-n", namespace) or {}
    conditions = found.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def event_messages(gw: GatewayProcess, namespace: str, *, kind: str, name: str) -> list[str]:
    """What the Events about one object say (KEDA's and the HPA controller's)."""
    listed = get_json(gw, "events", "-n", namespace) or {"items": []}
    return [
        f"{e.get('reason')}: {e.get('message')}"
        for e in listed["items"]
        if e["involvedObject"].get("kind") == kind and e["involvedObject"].get("name") == name
    ]


def test_keda_scales_a_model_from_zero_to_two_and_back(
    gateway: GatewayProcess, local_keda: LocalKeda, namespace: str, tmp_path: Path
) -> None:
    gw = gateway
    serve(
        gw, namespace, tmp_path, "pushed", 87,
        replicas=0, runtime={"contextSize": 2048, "concurrency": 1}, resources={"cpu": "100m"},
        scaling={"autoscaler": "KEDA", "minReplicas": 0, "maxReplicas": 2,
                 "targetUtilizationPercent": 100, "scaleUpWindow": "5s",
                 "scaleDownWindow": "15s", "idleTimeout": "30s", "drainTimeout": "60s"},
    )  # fmt: skip
    scaled = eventually(
        lambda: get_json(gw, "scaledobject", "pushed", "-n", namespace),
        timeout=60,
        what="Kama's ScaledObject",
    )
    assert scaled["spec"]["scaleTargetRef"]["kind"] == "ModelDeployment"
    assert scaled["spec"]["maxReplicaCount"] == 2
    eventually(
        lambda: scaled_object_ready(gw, namespace, "pushed"),
        timeout=60,
        what="KEDA to accept the ScaledObject (it reached the gateway's scaler)",
    )
    assert md(gw.control, namespace, "pushed")["spec"]["replicas"] == 0

    api, model = client(gw), f"{namespace}/pushed"
    # 3 clients on one slot a replica: demand 3 wants 3 replicas at 100 %, max 2
    with LoadLoop(api, model, workers=3, max_tokens=48) as load:
        eventually(
            lambda: md(gw.control, namespace, "pushed")["spec"]["replicas"] >= 1,
            timeout=60,
            what="KEDA to activate the model from zero",
        )
        eventually(
            lambda: md(gw.control, namespace, "pushed")["spec"]["replicas"] == 2,
            timeout=180,
            what="the HPA to add the second replica on the kama-demand metric",
        )
        wait_ready(gw.control, namespace, "pushed", 2)
        answered = load.answered
        eventually(
            lambda: load.answered >= answered + 6, timeout=120, what="answers from two replicas"
        )
    assert load.failures == [], load.failures
    hpa = get_json(gw, "hpa", "keda-hpa-pushed", "-n", namespace)
    assert hpa is not None, "KEDA made no HPA"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert "kama-demand" in metric["external"]["metric"]["name"]

    # no request: the HPA goes down to one, KEDA to zero after its cooldown (idleTimeout)
    eventually(
        lambda: (
            md(gw.control, namespace, "pushed")["spec"]["replicas"] == 0
            and not serving_pods(gw.control, namespace, "pushed")
        ),
        timeout=SERVE_TIMEOUT,
        what="KEDA to take the model back to zero",
    )
    assert scale_events(gw, namespace, "pushed") == [], "Kama made a replica decision itself"
    # who did: KEDA from and to zero, the HPA on the external metric in between
    by_keda = event_messages(gw, namespace, kind="ScaledObject", name="pushed")
    assert any("from 0 to 1" in m for m in by_keda), by_keda
    assert any("to 0" in m and "Deactivated" in m for m in by_keda), by_keda
    by_hpa = event_messages(gw, namespace, kind="HorizontalPodAutoscaler", name="keda-hpa-pushed")
    assert any("New size: 2" in m and "external metric" in m for m in by_hpa), by_hpa
