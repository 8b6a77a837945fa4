"""The KEDA ScaledObject Kama writes for a ModelDeployment in KEDA mode
(`spec.scaling.autoscaler: KEDA`): KEDA then owns `spec.replicas` through the
deployment's `/scale` subresource, from the same demand the built-in autoscaler reads.

The mapping keeps the built-in rule's meaning where the HPA has one:

- `minReplicas`/`maxReplicas` → `minReplicaCount`/`maxReplicaCount` (KEDA activates
  from zero and deactivates to `minReplicaCount` itself, the HPA moves between one and
  the maximum);
- `idleTimeout` → `cooldownPeriod` (how long without demand before zero);
- `scaleUpWindow` → the HPA's scale-up stabilisation window (it takes the lowest
  recommendation of the window: a sustained load, not a spike);
- `scaleDownWindow` → its scale-down stabilisation window (the highest recommendation
  of the window) and one replica per window at most; the HPA caps both at an hour;
- demand per replica → one `external-push` trigger on the gateway's scaler
  (`gateway.keda_scaler`), whose target is the demand one replica should carry: its
  slots (`runtime.concurrency`) at `targetUtilizationPercent`.

A scale-down never cuts a stream whoever asks for it: Kama drains a leaving replica
before it removes the pod (`workflows.drain`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from kama.api.deployment import ModelDeploymentSpec
from kama.api.meta import API_VERSION
from kama.contracts import ObjectRef
from kama.durations import parse_duration

KEDA_GROUP: Final = "keda.sh"
KEDA_VERSION: Final = "v1alpha1"
SCALED_OBJECTS: Final = "scaledobjects"
SCALED_OBJECT_KIND: Final = "ScaledObject"
TRIGGER_TYPE: Final = "external-push"
# scalerMetadata keys the gateway's scaler reads (gateway.keda_scaler)
TARGET_PER_REPLICA_KEY: Final = "targetPerReplica"
SCALER_ADDRESS_KEY: Final = "scalerAddress"
# KEDA asks the scaler whether the model is active this often; a request held at zero
# reaches KEDA at once through the push stream, so this bounds only the way down
POLLING_INTERVAL_S: Final = 5
HPA_MAX_WINDOW: Final = timedelta(hours=1)  # stabilizationWindowSeconds ≤ 3600
HPA_MAX_POLICY_PERIOD: Final = timedelta(minutes=30)  # periodSeconds ≤ 1800


def target_per_replica(spec: ModelDeploymentSpec) -> float:
    """The demand (requests in flight or queued) one replica should carry."""
    return spec.runtime.concurrency * spec.scaling.target_utilization_percent / 100


def scaled_object(
    *, ref: ObjectRef, spec: ModelDeploymentSpec, scaler_address: str
) -> dict[str, Any]:
    """The ScaledObject for one ModelDeployment: same name and namespace, owned by it
    (deleting the deployment deletes it)."""
    scaling = spec.scaling
    up = _seconds(parse_duration(scaling.scale_up_window), cap=HPA_MAX_WINDOW)
    down = _seconds(parse_duration(scaling.scale_down_window), cap=HPA_MAX_WINDOW)
    return {
        "apiVersion": f"{KEDA_GROUP}/{KEDA_VERSION}",
        "kind": SCALED_OBJECT_KIND,
        "metadata": {
            "name": ref.name,
            "namespace": ref.namespace,
            "labels": {"app.kubernetes.io/managed-by": "kama"},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "ModelDeployment",
                    "name": ref.name,
                    "uid": ref.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "scaleTargetRef": {
                "apiVersion": API_VERSION,
                "kind": "ModelDeployment",
                "name": ref.name,
            },
            "minReplicaCount": scaling.min_replicas,
            "maxReplicaCount": scaling.max_replicas,
            "pollingInterval": POLLING_INTERVAL_S,
            "cooldownPeriod": max(1, int(parse_duration(scaling.idle_timeout).total_seconds())),
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleUp": {"stabilizationWindowSeconds": up},
                        "scaleDown": {
                            "stabilizationWindowSeconds": down,
                            "policies": [
                                {
                                    "type": "Pods",
                                    "value": 1,
                                    "periodSeconds": max(
                                        1, min(down, int(HPA_MAX_POLICY_PERIOD.total_seconds()))
                                    ),
                                }
                            ],
                        },
                    }
                }
            },
            "triggers": [
                {
                    "type": TRIGGER_TYPE,
                    "metadata": {
                        SCALER_ADDRESS_KEY: scaler_address,
                        TARGET_PER_REPLICA_KEY: f"{target_per_replica(spec):g}",
                    },
                }
            ],
        },
    }


def _seconds(window: timedelta, *, cap: timedelta) -> int:
    return int(min(window, cap).total_seconds())
