"""The real KEDA on the local stack, without Kama: a ScaledObject with a cron trigger
(a scaler that needs no outside system) takes a Deployment of the shell image from
zero to two and back.

KEDA itself activates the Deployment from zero to one; the HPA it creates takes it on
to two, reading KEDA's metric through `external.metrics.k8s.io` (the API server's
aggregation layer → the metrics adapter → the operator's gRPC metrics service); once
the window has passed and the cooldown is over, KEDA scales it back to zero.
"""

from __future__ import annotations

import datetime
import json
import urllib.parse
from typing import Any

from kamadev.keda import EXTERNAL_METRICS_API, LocalKeda
from kamadev.stack import SHELL_IMAGE, LocalStack
from tests.support import apply, eventually, get_json, kubectl, wait_gone

NAME = "sleeper"
SCALE_TIMEOUT = 120.0


def deployment(namespace: str) -> dict[str, Any]:
    labels = {"app": NAME}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    # sleep as PID 1 ignores SIGTERM: no grace period to sit out
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {"name": "main", "image": SHELL_IMAGE, "command": ["sleep", "3600"]}
                    ],
                },
            },
        },
    }


def daily(at: datetime.datetime) -> str:
    """A cron schedule firing every day at `at`'s minute."""
    return f"{at.minute} {at.hour} * * *"


def scaled_object(namespace: str, *, start: str, end: str) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"name": NAME},
            "pollingInterval": 1,
            "cooldownPeriod": 3,
            "minReplicaCount": 0,
            "maxReplicaCount": 2,
            "triggers": [
                {
                    "type": "cron",
                    "metadata": {
                        "timezone": "Etc/UTC",
                        "start": start,
                        "end": end,
                        "desiredReplicas": "2",
                    },
                }
            ],
        },
    }


def replicas(stack: LocalStack, namespace: str) -> tuple[int, int, int]:
    """(spec.replicas, status.replicas, status.readyReplicas) of the Deployment."""
    obj = get_json(stack, "deployment", NAME, "-n", namespace)
    status = obj.get("status", {})
    return obj["spec"]["replicas"], status.get("replicas", 0), status.get("readyReplicas", 0)


def get_raw(stack: LocalStack, path: str) -> Any:
    return json.loads(kubectl(stack, "get", "--raw", path).stdout)


def has_event(stack: LocalStack, namespace: str, name: str, *parts: str) -> bool:
    """Whether an event about an object called `name` (the ScaledObject and the
    Deployment share one) has a message starting with `parts[0]` containing the rest."""
    events = get_json(
        stack, "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    )
    return any(
        event["message"].startswith(parts[0]) and all(p in event["message"] for p in parts[1:])
        for event in events["items"]
    )


def quantity(text: str) -> float:
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def test_cron_scaled_object_scales_a_deployment_from_zero_to_two_and_back(
    stack: LocalStack, local_keda: LocalKeda, namespace: str
) -> None:
    apply(stack, deployment(namespace))
    now = datetime.datetime.now(datetime.UTC)
    # a daily window that opened a minute ago and closes in half an hour
    window = scaled_object(
        namespace,
        start=daily(now - datetime.timedelta(minutes=1)),
        end=daily(now + datetime.timedelta(minutes=30)),
    )
    apply(stack, window)

    eventually(
        lambda: replicas(stack, namespace) == (2, 2, 2),
        timeout=SCALE_TIMEOUT,
        what="the Deployment scaled 0 → 2 with both pods ready",
    )

    # the HPA is KEDA's, and it got to two by reading KEDA's external metric
    hpa = get_json(stack, "hpa", f"keda-hpa-{NAME}", "-n", namespace)
    owner = hpa["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("ScaledObject", NAME)
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 2)
    metric = hpa["spec"]["metrics"][0]["external"]["metric"]
    assert metric["name"].startswith("s0-cron-"), metric

    def hpa_read_metric() -> list[dict[str, Any]] | None:
        """The HPA's reading of KEDA's metric, once it is 2. The HPA states it per
        replica (the metric over the replicas it had when it read it: 2 at one
        replica, 1 at two, after its next sync), so the total is compared."""
        status = get_json(stack, "hpa", f"keda-hpa-{NAME}", "-n", namespace)["status"]
        current = status.get("currentMetrics") or []
        ext = [m["external"] for m in current if m.get("type") == "External"]
        if not ext:
            return None
        total = quantity(ext[0]["current"]["averageValue"]) * status.get("currentReplicas", 0)
        return ext if total == 2 else None

    eventually(hpa_read_metric, timeout=30, what="the HPA's current external metric of 2")
    # 0 → 1 was KEDA's activation, 1 → 2 the HPA's, on the external metric it read
    eventually(
        lambda: has_event(stack, namespace, NAME, "Scaled ", f"{namespace}/{NAME} from 0 to 1"),
        timeout=30,
        what="KEDA's event: activated 0 → 1",
    )
    eventually(
        lambda: has_event(
            stack, namespace, f"keda-hpa-{NAME}", "New size: 2; reason: external metric s0-cron-"
        ),
        timeout=30,
        what="the HPA's event: rescaled to 2 on the external metric",
    )

    # the external metrics API through the aggregator, as the HPA controller asks it
    selector = ",".join(f"{k}={v}" for k, v in metric["selector"]["matchLabels"].items())
    path = (
        f"{EXTERNAL_METRICS_API}/namespaces/{namespace}/{metric['name']}"
        f"?labelSelector={urllib.parse.quote(selector)}"
    )
    served = get_raw(stack, path)
    assert served["kind"] == "ExternalMetricValueList"
    assert [quantity(item["value"]) for item in served["items"]] == [2.0]

    so = get_json(stack, "scaledobject", NAME, "-n", namespace)
    conditions = {c["type"]: c["status"] for c in so["status"]["conditions"]}
    assert conditions["Ready"] == "True" and conditions["Active"] == "True", conditions

    # move the window into the future: inactive, and zero after the cooldown
    later = scaled_object(
        namespace,
        start=daily(now + datetime.timedelta(hours=2)),
        end=daily(now + datetime.timedelta(hours=3)),
    )
    apply(stack, later)
    eventually(
        lambda: replicas(stack, namespace) == (0, 0, 0),
        timeout=SCALE_TIMEOUT,
        what="the Deployment scaled back to 0",
    )
    eventually(
        lambda: has_event(
            stack, namespace, NAME, "Deactivated ", f"{namespace}/{NAME} from 2 to 0"
        ),
        timeout=30,
        what="KEDA's event: deactivated 2 → 0",
    )
    so = get_json(stack, "scaledobject", NAME, "-n", namespace)
    conditions = {c["type"]: c["status"] for c in so["status"]["conditions"]}
    assert conditions["Active"] == "False", conditions

    # deleting the ScaledObject removes its HPA (KEDA's finalizer runs)
    kubectl(stack, "delete", "scaledobject", NAME, "-n", namespace, "--timeout=60s")
    wait_gone(stack, "hpa", f"keda-hpa-{NAME}", namespace, timeout=30, what="KEDA's HPA deleted")
    local_keda.check_alive()
