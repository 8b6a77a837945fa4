"""Heartbeats for Node objects no kubelet runs: the fake GPU nodes (labelled
`kama.dev/fake-node`) that let the planner and the real scheduler place GPU pods. A Node whose lease is not renewed goes NotReady and is tainted
by the node lifecycle controller, so these renew the lease and post Ready conditions
every few seconds, as a kubelet does.
"""

from __future__ import annotations

import datetime
import logging
import threading
from typing import Any

from kubernetes import client as k8s

log = logging.getLogger("kamadev.fake_nodes")

FAKE_NODE_LABEL = "kama.dev/fake-node"
LEASE_S = 40
HEARTBEAT_S = 10.0


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def ready_conditions(at: datetime.datetime) -> list[dict[str, Any]]:
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    pressure = [
        {
            "type": t,
            "status": "False",
            "reason": f"KubeletHas{r}",
            "message": m,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }
        for t, r, m in (
            ("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"),
        )
    ]
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "the local stack is posting ready status",
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }
    return [*pressure, ready]


def renew_lease(coordination: k8s.CoordinationV1Api, *, node: str) -> None:
    at = now()
    try:
        coordination.patch_namespaced_lease(
            node,
            "kube-node-lease",
            {"spec": {"renewTime": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}},
            _content_type="application/merge-patch+json",
        )
    except k8s.ApiException as exc:
        if exc.status != 404:
            raise
        body = k8s.V1Lease(
            metadata=k8s.V1ObjectMeta(name=node, namespace="kube-node-lease"),
            spec=k8s.V1LeaseSpec(
                holder_identity=node, lease_duration_seconds=LEASE_S, renew_time=at
            ),
        )
        coordination.create_namespaced_lease("kube-node-lease", body)


def heartbeat_loop(
    *,
    core: k8s.CoreV1Api,
    coordination: k8s.CoordinationV1Api,
    stop: threading.Event,
) -> None:
    """Until `stop`: renew every fake node."""
    interval = 0.0
    while not stop.wait(interval):
        interval = HEARTBEAT_S
        try:
            fakes = core.list_node(label_selector=f"{FAKE_NODE_LABEL}=true")
            for name in (n.metadata.name for n in fakes.items):
                renew_lease(coordination, node=name)
                core.patch_node_status(name, {"status": {"conditions": ready_conditions(now())}})
        except Exception as exc:
            log.warning("heartbeat failed: %s", exc)
