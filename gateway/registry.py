"""What the gateway knows about models and their replicas, kept from watches.

ModelDeployments give names, aliases, scaling limits and the reason a model is not
serving; Kama's serving pods give endpoints (ready, not draining, not deleting,
with an IP and a slot count from their serving plan). Watch threads hand objects
to `apply_*` on the event loop; request handlers read. Waiters for a model at
zero are woken when its first endpoint appears.

A request takes its replica with `acquire`, which picks one and counts the request
in flight there (and in the model, and in the metrics) and hands back a `Lease`; the
lease's `release` is the only way those counts go down, and the proxy calls it once,
in a `finally` (kubeai's `AwaitBestAddress` returns its `done` the same way)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gateway.metrics import GatewayMetrics, RequestSeries
from gateway.routing import choose_endpoint
from kama.durations import parse_duration
from kama.serving_pod import DEPLOYMENT_LABEL, DRAINING_LABEL

DEFAULT_COLD_START_S = 600.0
DEFAULT_MAX_QUEUED = 100
LATENCY_SMOOTHING = 0.2


@dataclass
class Endpoint:
    pod: str
    ip: str
    slots: int
    in_flight: int = 0
    others: int = 0  # requests other gateways have there (llama-server's view minus ours)
    latency_s: float = 0.0  # smoothed time to response headers
    served: int = 0
    early: bool = False  # confirmed by the supervisor's /readyz before the kubelet said Ready
    unreachable_until: float = 0.0  # a connection timed out: others first until then

    def pressure(self) -> float:
        return (self.in_flight + self.others) / max(self.slots, 1)

    def observe_backend(self, *, held: int, ours: int) -> None:
        """llama-server said it holds `held` requests (processing + deferred) while
        this gateway had at most `ours` there. Only the difference is someone else's:
        counting our own would double them, and a poll is up to an interval old
        while our in-flight count is exact."""
        self.others = max(0, held - ours)

    def observe_latency(self, seconds: float) -> None:
        if self.latency_s == 0.0:
            self.latency_s = seconds
        else:
            self.latency_s += LATENCY_SMOOTHING * (seconds - self.latency_s)


@dataclass
class Model:
    namespace: str
    name: str
    uid: str
    aliases: tuple[str, ...] = ()
    max_queued: int = DEFAULT_MAX_QUEUED
    cold_start_s: float = DEFAULT_COLD_START_S
    reason: str = ""
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    starting: dict[str, Endpoint] = field(default_factory=dict)  # running, not Ready yet
    held: int = 0  # requests waiting for a replica
    in_flight: int = 0
    requests_since_report: int = 0
    created: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _slots(pod: dict[str, Any]) -> int:
    for container in pod.get("spec", {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == "KAMA_SERVING_PLAN" and env.get("value"):
                return int(json.loads(env["value"]).get("concurrency", 1))
    return 1


def _pod_state(pod: dict[str, Any]) -> str:
    """ "routable" (Ready, not leaving), "starting" (running, not Ready yet) or "out"."""
    meta, status = pod.get("metadata", {}), pod.get("status") or {}
    leaving = (
        bool(meta.get("deletionTimestamp"))
        or (meta.get("labels") or {}).get(DRAINING_LABEL) == "true"
        or status.get("phase") != "Running"
        or not status.get("podIP")
    )
    if leaving:
        return "out"
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return "routable" if ready else "starting"


def _reason(status: dict[str, Any]) -> str:
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    for kind in ("ArtifactReady", "FitFailed", "RuntimeReady"):
        c = conditions.get(kind)
        bad = c is not None and (c.get("status") == "True") == (kind == "FitFailed")
        if c is not None and bad and c.get("reason") not in ("ScaledToZero", "Starting"):
            return f"{c.get('reason')}: {c.get('message')}"
    return str(status.get("reason") or "")


@dataclass(eq=False, slots=True)
class Lease:
    """One request's place on one replica, from `ModelRegistry.acquire` to `release`."""

    model: Model
    endpoint: Endpoint
    series: RequestSeries
    released: bool = False

    def release(self) -> None:
        """The request is over (answered, failed or abandoned); a second call does nothing."""
        if self.released:
            return
        self.released = True
        self.endpoint.in_flight -= 1
        self.model.in_flight -= 1
        self.series.end()


class ModelRegistry:
    def __init__(self, *, metrics: GatewayMetrics | None = None) -> None:
        self.metrics = metrics or GatewayMetrics()
        self.models: dict[str, Model] = {}
        self._pods: dict[str, tuple[str, dict[str, Any]]] = {}  # ns/pod -> (model key, pod)

    # name resolution ------------------------------------------------------------

    def resolve(self, name: str) -> Model | None:
        """`<namespace>/<name>`, or an alias no other model uses."""
        if name in self.models:
            return self.models[name]
        matches = [m for m in self.models.values() if name in m.aliases]
        return matches[0] if len(matches) == 1 else None

    # watch events (on the event loop) -------------------------------------------

    def apply_deployment(self, event: str, obj: dict[str, Any]) -> None:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        key = f"{meta['namespace']}/{meta['name']}"
        if event == "DELETED" or meta.get("deletionTimestamp"):
            model = self.models.pop(key, None)
            if model is not None:
                model.ready.set()  # release waiters; they find the model gone
            return
        scaling = spec.get("scaling") or {}
        model = self.models.get(key)
        if model is None or model.uid != meta["uid"]:
            model = Model(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
            self.models[key] = model
            for pod_key, (owner, pod) in list(self._pods.items()):
                if owner == key:
                    self._place_pod(pod_key, owner, pod)
        model.aliases = tuple(spec.get("aliases") or ())
        model.max_queued = int(scaling.get("maxQueuedRequests", DEFAULT_MAX_QUEUED))
        model.cold_start_s = parse_duration(scaling.get("coldStartTimeout", "10m")).total_seconds()
        model.reason = _reason(obj.get("status") or {})
        model.created = int(_created(meta))

    def apply_pod(self, event: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        deployment = (meta.get("labels") or {}).get(DEPLOYMENT_LABEL)
        if not deployment:
            return
        pod_key = f"{meta['namespace']}/{meta['name']}"
        owner = f"{meta['namespace']}/{deployment}"
        if event == "DELETED":
            self._pods.pop(pod_key, None)
            self.metrics.forget_pod(owner, meta["name"])
            model = self.models.get(owner)
            if model is not None:
                model.endpoints.pop(meta["name"], None)
                model.starting.pop(meta["name"], None)
                self._update_ready(model)
            return
        self._pods[pod_key] = (owner, pod)
        self._place_pod(pod_key, owner, pod)

    def _place_pod(self, pod_key: str, owner: str, pod: dict[str, Any]) -> None:
        model = self.models.get(owner)
        if model is None:
            return
        name = pod["metadata"]["name"]
        state = _pod_state(pod)
        current = model.endpoints.get(name)
        if state == "routable":
            model.starting.pop(name, None)
            ip = pod["status"]["podIP"]
            if current is None or current.ip != ip:
                model.endpoints[name] = Endpoint(pod=name, ip=ip, slots=_slots(pod))
            else:
                current.early = False
        elif state == "starting" and current is not None and current.early:
            pass  # its supervisor already said ready; the kubelet will catch up
        elif state == "starting":
            model.endpoints.pop(name, None)
            model.starting[name] = Endpoint(pod=name, ip=pod["status"]["podIP"], slots=_slots(pod))
        else:
            model.endpoints.pop(name, None)
            model.starting.pop(name, None)
        self._update_ready(model)

    def confirm_early(self, model: Model, pod: str) -> None:
        """A starting pod's supervisor reported ready: route to it now (a model at
        zero should not wait a kubelet probe period more than it must)."""
        endpoint = model.starting.pop(pod, None)
        if endpoint is not None and model is self.models.get(model.key):
            endpoint.early = True
            model.endpoints[pod] = endpoint
            self._update_ready(model)

    def _update_ready(self, model: Model) -> None:
        if model.endpoints:
            model.ready.set()
        else:
            model.ready.clear()

    # requests ------------------------------------------------------------------

    def acquire(
        self, model: Model, *, route: str, exclude: Collection[str], now: float
    ) -> Lease | None:
        """The replica for the next request (see `gateway.routing`), counted in flight
        until the returned lease is released; None if no replica is left to try."""
        endpoint = choose_endpoint(model.endpoints.values(), exclude=exclude, now=now)
        if endpoint is None:
            return None
        series = self.metrics.series(model=model.key, route=route, pod=endpoint.pod)
        endpoint.in_flight += 1
        endpoint.served += 1
        model.in_flight += 1
        model.requests_since_report += 1
        series.begin()
        return Lease(model=model, endpoint=endpoint, series=series)

    def drop_endpoint(self, model: Model, endpoint: Endpoint) -> None:
        """A connection to it failed: stop routing there until the watch says otherwise."""
        model.endpoints.pop(endpoint.pod, None)
        self._update_ready(model)


def _created(meta: dict[str, Any]) -> float:
    stamp = meta.get("creationTimestamp")
    if not stamp:
        return 0.0
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
