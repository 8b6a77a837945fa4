"""Watch objects and a ready-made gateway state for the gateway's tests and its
benchmark: a ModelDeployment, a serving pod, a state whose one model has replicas
at given addresses (or none, behind a wake queue on a recording stand-in for
Temporal), with no watches behind it; and a clock the tests step."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.app import GatewayState
from gateway.auth import AccessControl
from gateway.held import DEFAULT_MAX_HELD_BYTES
from gateway.metrics import GatewayMetrics
from gateway.proxy import Proxy
from gateway.registry import Model, ModelRegistry
from gateway.transport.upstream import UpstreamTransport
from gateway.wake import Waker
from informer.watch import WatchHealth
from kama.serving_plan import ServingPlan
from kama.serving_pod import SERVING_PLAN_ENV


def deployment(
    name: str,
    *,
    namespace: str = "ns",
    uid: str = "u1",
    aliases: list[str] | None = None,
    created: str = "2026-01-01T00:00:00Z",
    **status: Any,
) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": uid,
            "creationTimestamp": created,
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
    owner_uid: str = "u1",  # its controlling ModelDeployment's (`deployment`'s default)
) -> dict[str, Any]:
    plan = ServingPlan(
        entrypoint="m.gguf", manifest_digest="a" * 64, ctx_total=1024, concurrency=slots
    )
    labels = {"kama.dev/deployment": model}
    if draining:
        labels["kama.dev/draining"] = "true"
    return {
        "metadata": {
            "namespace": namespace,
            "name": name,
            "labels": labels,
            "ownerReferences": [
                {"kind": "ModelDeployment", "name": model, "uid": owner_uid, "controller": True}
            ],
        },
        "spec": {"containers": [{"env": [{"name": SERVING_PLAN_ENV, "value": plan.to_json()}]}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


class RecordingTemporal:
    """Stands in for the Temporal client in the wake queue's unit tests: it records
    the wake workflows the gateway starts and the signals it sends them (the real
    calls are covered on the stack)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.signalled: list[tuple[str, str | None, str]] = []

    async def start_workflow(self, *_args: Any, id: str, **_kwargs: Any) -> RecordingHandle:
        self.started.append(id)
        return RecordingHandle(temporal=self, workflow_id=id, run_id=f"run-{len(self.started)}")

    def get_workflow_handle(self, workflow_id: str, *, run_id: str | None) -> RecordingHandle:
        return RecordingHandle(temporal=self, workflow_id=workflow_id, run_id=run_id)


@dataclass
class RecordingHandle:
    temporal: RecordingTemporal
    workflow_id: str
    run_id: str | None

    async def signal(self, signal: str, *_args: Any, **_kwargs: Any) -> None:
        self.temporal.signalled.append((self.workflow_id, self.run_id, signal))


class ManualClock:
    """A `gateway.clock.Clock` whose time moves only when the test says: `advance`
    wakes every sleeper due on the way, earliest first, at its own time, and lets the
    tasks it wakes run before time moves on. Nothing here waits on real time."""

    SETTLE_ROUNDS = 20  # event-loop turns for woken tasks to reach their next await

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        woken = asyncio.get_running_loop().create_future()
        # a positive sleep ends later, however short (`now + seconds` may round to `now`)
        due = max(self._now + seconds, math.nextafter(self._now, math.inf))
        heapq.heappush(self._sleepers, (due, next(self._order), woken))
        await woken

    async def settle(self) -> None:
        """Let every task that can run without time passing run."""
        for _ in range(self.SETTLE_ROUNDS):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move time `seconds` forward, waking each sleeper due on the way."""
        target = self._now + seconds
        await self.settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            due, _, woken = heapq.heappop(self._sleepers)
            if woken.done():  # its sleeper was cancelled
                continue
            self._now = max(self._now, due)
            woken.set_result(None)
            await self.settle()
        self._now = target
        await self.settle()

    async def advance_until(self, condition: Callable[[], bool], *, within: float) -> float:
        """Move time from one sleeper's due time to the next until `condition` holds;
        the seconds that took. Fails if it does not hold within `within` seconds."""
        start = self._now
        await self.settle()
        while not condition():
            due = min((d for d, _, woken in self._sleepers if not woken.done()), default=None)
            assert due is not None, "nothing is waiting for time to pass"
            assert due - start <= within, f"not within {within}s"
            await self.advance(due - self._now)
        return self._now - start


class NoWake:
    """The wake queue of a gateway whose models all have replicas."""

    async def hold_until_ready(self, model: Model) -> None:
        raise AssertionError(f"{model.key} has a replica: nothing to wake")


def fixed_state(
    *,
    model: str,
    replica_ips: list[str],
    replica_port: int,
    slots: int = 64,
    max_held_bytes: int = DEFAULT_MAX_HELD_BYTES,
    auth: str = "disabled",
    serving_key: str | None = None,
) -> GatewayState:
    """A gateway state whose model `<ns>/<name>` has one ready replica per address,
    all listening on `replica_port`; with no address, the model is at zero and its
    requests are held by a wake queue whose Temporal only records. Authentication is
    off unless `auth="apikey"` (then keys are applied to `state.access`); with a
    `serving_key` (the master key) requests carry each replica's llama-server key."""
    namespace, name = model.split("/")
    metrics = GatewayMetrics()
    registry = ModelRegistry(metrics=metrics, serving_key=serving_key)
    registry.apply_deployment("ADDED", deployment(name, namespace=namespace))
    for number, ip in enumerate(replica_ips):
        registry.apply_pod(
            "ADDED",
            pod(f"{name}-{number}", namespace=namespace, model=name, ip=ip, slots=slots),
        )
    waker = (
        Waker(
            client=RecordingTemporal(),  # type: ignore[arg-type]
            task_queue="q",
            cluster="",
            metrics=metrics,
            registry=registry,
            http=httpx.AsyncClient(),
        )
        if not replica_ips
        else NoWake()
    )
    proxy = Proxy(
        registry=registry,
        upstream=UpstreamTransport(),
        waker=waker,
        replica_port=replica_port,
        max_held_bytes=max_held_bytes,
    )
    return GatewayState(
        registry=registry,
        proxy=proxy,
        metrics=metrics,
        health=WatchHealth(),
        access=AccessControl(metrics=metrics, mode=auth),
    )
