"""The ScaledObject of KEDA mode: the deployment's bounds, windows and idle timeout
become KEDA's and the HPA's settings, the trigger calls the gateway's scaler with
the demand one replica should carry, and the deployment owns it."""

from __future__ import annotations

from typing import Any

from kama.api.deployment import ModelDeploymentSpec
from kama.contracts import ObjectRef
from kama.scaled_object import TARGET_PER_REPLICA_KEY, scaled_object

REF = ObjectRef(namespace="ml", name="chat", uid="u-1")


def spec(**scaling: Any) -> ModelDeploymentSpec:
    return ModelDeploymentSpec.model_validate(
        {
            "modelRef": {"name": "tiny"},
            "runtime": {"contextSize": 2048, "concurrency": 4},
            "scaling": {"autoscaler": "KEDA", **scaling},
        }
    )


def test_bounds_windows_and_cooldown_come_from_the_deployment() -> None:
    made = scaled_object(
        ref=REF,
        spec=spec(
            minReplicas=1,
            maxReplicas=5,
            idleTimeout="15m",
            scaleUpWindow="45s",
            scaleDownWindow="10m",
            targetUtilizationPercent=80,
        ),
        scaler_address="kama-gateway.kama.svc:9091",
    )
    body = made["spec"]
    assert body["scaleTargetRef"] == {
        "apiVersion": "kama.dev/v1alpha1",
        "kind": "ModelDeployment",
        "name": "chat",
    }
    assert (body["minReplicaCount"], body["maxReplicaCount"]) == (1, 5)
    assert body["cooldownPeriod"] == 900
    behavior = body["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 45
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 600}]
    (trigger,) = body["triggers"]
    assert trigger["type"] == "external-push"
    assert trigger["metadata"]["scalerAddress"] == "kama-gateway.kama.svc:9091"
    # 4 slots a replica at 80 %: 3.2 requests in flight or queued per replica
    assert trigger["metadata"][TARGET_PER_REPLICA_KEY] == "3.2"
    (owner,) = made["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "ModelDeployment",
        "chat",
        "u-1",
        True,
    )


def test_windows_past_the_hpas_limits_are_capped() -> None:
    """The HPA refuses stabilisation windows above an hour and policy periods above
    half an hour; a day-long scaleDownWindow must still give a valid ScaledObject."""
    behavior = scaled_object(ref=REF, spec=spec(scaleDownWindow="24h"), scaler_address="gw:1")[
        "spec"
    ]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 3600
    assert behavior["scaleDown"]["policies"][0]["periodSeconds"] == 1800
