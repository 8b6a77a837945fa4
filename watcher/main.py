"""`kama watcher`: list+watch Kama's resources and serving pods, and nudge or
signal their workflows: one event at a time, from a queue that keeps each object's
latest event only and lets namespaces take turns (`watcher.event_queue`), with the
serving pods' events that change nothing a workflow reads left out
(`watcher.pod_changes`)."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client

from informer.watch import (
    WatchHealth,
    WatchTarget,
    in_namespaces,
    kama_objects,
    labelled_pods,
    start_watch,
)
from kama.api import GROUP, VERSION
from kama.config import Settings
from kama.serving_key import controller_uid
from kama.serving_pod import ROLE_LABEL, SERVER_ROLE
from watcher.dependents import DeploymentSignals
from watcher.event_queue import CoalescingQueue
from watcher.metrics import WatcherMetrics
from watcher.nudge import ARTIFACT, CACHE, DEPLOYMENT, EntityKind, Nudger
from watcher.pod_changes import PodChanges

log = logging.getLogger("kama.watcher")

NUDGE_RETRY_S = 2.0

Handler = Callable[[str, dict[str, Any]], Awaitable[None]]


def watch_targets(
    *, settings: Settings, api: k8s.ApiClient, custom: k8s.CustomObjectsApi
) -> list[WatchTarget]:
    namespaces = settings.tenancy.watch_namespaces
    targets: list[WatchTarget] = []
    for entity in (ARTIFACT, CACHE, DEPLOYMENT):

        def objects(namespace: str | None, plural: str = entity.plural) -> WatchTarget:
            return kama_objects(
                custom=custom, group=GROUP, version=VERSION, plural=plural, namespace=namespace
            )

        targets += in_namespaces(objects, namespaces=namespaces)
    targets += in_namespaces(
        lambda namespace: labelled_pods(
            api=api, selector=f"{ROLE_LABEL}={SERVER_ROLE}", namespace=namespace
        ),
        namespaces=namespaces,
    )
    return targets


def counted_nudge(*, nudger: Nudger, entity: EntityKind, metrics: WatcherMetrics) -> Handler:
    """`nudger.nudge`, counted by outcome (a deletion is no nudge: the finalizer waits
    for the workflow)."""

    async def nudge(kind: str, obj: dict[str, Any]) -> None:
        try:
            await nudger.nudge(kind, obj)
        except Exception:
            metrics.nudged(kind=entity.kind, outcome="error")
            raise
        if kind != "DELETED":
            metrics.nudged(kind=entity.kind, outcome="ok")

    return nudge


def handlers(
    *,
    client: Client,
    custom: k8s.CustomObjectsApi,
    settings: Settings,
    metrics: WatcherMetrics | None = None,
) -> dict[str, Handler]:
    metrics = metrics or WatcherMetrics()
    nudge = {
        entity.plural: counted_nudge(
            nudger=Nudger(client=client, custom=custom, settings=settings, entity=entity),
            entity=entity,
            metrics=metrics,
        )
        for entity in (ARTIFACT, CACHE, DEPLOYMENT)
    }
    signals = DeploymentSignals(
        client=client, custom=custom, cluster=settings.cluster, metrics=metrics
    )

    async def on_artifact(kind: str, obj: dict[str, Any]) -> None:
        await nudge[ARTIFACT.plural](kind, obj)
        await signals.artifact_event(kind, obj)

    return {
        ARTIFACT.plural: on_artifact,
        CACHE.plural: nudge[CACHE.plural],
        DEPLOYMENT.plural: nudge[DEPLOYMENT.plural],
        "pods": signals.pod_event,
    }


async def run_watcher(
    *,
    settings: Settings,
    api: k8s.ApiClient,
    client: Client,
    stop: threading.Event,
    health: WatchHealth,
    metrics: WatcherMetrics | None = None,
) -> None:
    custom = k8s.CustomObjectsApi(api)
    metrics = metrics or WatcherMetrics(health=health)
    handle = handlers(client=client, custom=custom, settings=settings, metrics=metrics)
    loop = asyncio.get_running_loop()
    queue = CoalescingQueue()
    pods = PodChanges()

    def enqueue(name: str, kind: str, obj: dict[str, Any]) -> None:
        metrics.event(resource=name, type=kind)
        if name == "pods" and not pods.changed(kind, obj):
            metrics.skipped(reason="unchanged")
            return
        before = queue.coalesced
        queue.put(event_key(name, obj), namespace=_namespace(obj), event=(name, kind, obj))
        if queue.coalesced > before:
            metrics.skipped(reason="coalesced")

    for target in watch_targets(settings=settings, api=api, custom=custom):

        def on_object(kind: str, obj: dict[str, Any], name: str = target.name) -> None:
            loop.call_soon_threadsafe(enqueue, name, kind, obj)

        start_watch(target=target, on_object=on_object, stop=stop, health=health)
    while not stop.is_set():
        try:
            name, kind, obj = await asyncio.wait_for(queue.get(), timeout=1)
        except TimeoutError:
            continue
        try:
            await handle[name](kind, obj)
        except Exception:
            log.exception(
                "handling %s of %s failed; retrying", kind, obj.get("metadata", {}).get("name")
            )
            loop.call_later(
                NUDGE_RETRY_S,
                functools.partial(
                    queue.retry,
                    event_key(name, obj),
                    namespace=_namespace(obj),
                    event=(name, kind, obj),
                ),
            )


def event_key(name: str, obj: dict[str, Any]) -> tuple[str, str, str]:
    """What an event coalesces with (`watcher.event_queue`): the same object, or for a
    serving pod, every pod of the same deployment (their events all ask its workflow
    to look at its pods again)."""
    meta = obj.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    if name == "pods":
        owner = controller_uid(meta.get("ownerReferences"))
        return ("pods", _namespace(obj), owner or uid)
    return (name, _namespace(obj), uid)


def _namespace(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")
