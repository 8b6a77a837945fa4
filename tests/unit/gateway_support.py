"""Watch objects and a ready-made gateway state for the gateway's tests and its
benchmark: a ModelDeployment, a serving pod, and a state whose one model has
replicas at given addresses, with no watches and no Temporal behind it."""

from __future__ import annotations

from typing import Any

from gateway.app import GatewayState
from gateway.metrics import GatewayMetrics
from gateway.proxy import Proxy
from gateway.registry import Model, ModelRegistry
from gateway.transport.upstream import UpstreamTransport
from kama.serving_plan import ServingPlan
from watcher.watch import WatchHealth


def deployment(
    name: str,
    *,
    namespace: str = "ns",
    uid: str = "u1",
    aliases: list[str] | None = None,
    **status: Any,
) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": uid,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "aliases": aliases or [],
            "scaling": {"maxQueuedRequests": 7, "coldStartTimeout": "90s"},
        },
        "status": status,
    }


def pod(
    name: str,
    *,
    namespace: str = "ns",
    model: str = "chat",
    ready: bool = True,
    draining: bool = False,
    ip: str = "10.0.0.1",
    slots: int = 4,
) -> dict[str, Any]:
    plan = ServingPlan(
        entrypoint="m.gguf", manifest_digest="a" * 64, ctx_total=1024, concurrency=slots
    )
    labels = {"kama.dev/deployment": model}
    if draining:
        labels["kama.dev/draining"] = "true"
    return {
        "metadata": {"namespace": namespace, "name": name, "labels": labels},
        "spec": {"containers": [{"env": [{"name": "KAMA_SERVING_PLAN", "value": plan.to_json()}]}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


class NoWake:
    """The wake queue of a gateway whose models all have replicas."""

    async def hold_until_ready(self, model: Model) -> None:
        raise AssertionError(f"{model.key} has a replica: nothing to wake")


def fixed_state(
    *, model: str, replica_ips: list[str], replica_port: int, slots: int = 64
) -> GatewayState:
    """A gateway state whose model `<ns>/<name>` has one ready replica per address,
    all listening on `replica_port`."""
    namespace, name = model.split("/")
    metrics = GatewayMetrics()
    registry = ModelRegistry(metrics=metrics)
    registry.apply_deployment("ADDED", deployment(name, namespace=namespace))
    for number, ip in enumerate(replica_ips):
        registry.apply_pod(
            "ADDED",
            pod(f"{name}-{number}", namespace=namespace, model=name, ip=ip, slots=slots),
        )
    proxy = Proxy(
        registry=registry, upstream=UpstreamTransport(), waker=NoWake(), replica_port=replica_port
    )
    return GatewayState(registry=registry, proxy=proxy, metrics=metrics, health=WatchHealth())
