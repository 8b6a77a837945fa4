"""`kama watcher`: list+watch Kama's resources and serving pods, and nudge or
signal their workflows."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client

from kama.api import GROUP, VERSION
from kama.config import Settings
from kama.serving_pod import ROLE_LABEL, SERVER_ROLE
from watcher.dependents import DeploymentSignals
from watcher.nudge import ARTIFACT, CACHE, DEPLOYMENT, Nudger
from watcher.watch import WatchHealth, WatchTarget, as_dicts, start_watch

log = logging.getLogger("kama.watcher")

NUDGE_RETRY_S = 2.0

Handler = Callable[[str, dict[str, Any]], Awaitable[None]]


def watch_targets(
    *, settings: Settings, api: k8s.ApiClient, custom: k8s.CustomObjectsApi
) -> list[WatchTarget]:
    core = k8s.CoreV1Api(api)
    targets = []
    for entity in (ARTIFACT, CACHE, DEPLOYMENT):
        kwargs: dict[str, Any] = {"group": GROUP, "version": VERSION, "plural": entity.plural}
        if settings.watch_namespace:
            kwargs["namespace"] = settings.watch_namespace
            list_fn = custom.list_namespaced_custom_object
        else:
            list_fn = custom.list_cluster_custom_object
        targets.append(WatchTarget(name=entity.plural, list_fn=list_fn, kwargs=kwargs))
    pods: dict[str, Any] = {"label_selector": f"{ROLE_LABEL}={SERVER_ROLE}"}
    if settings.watch_namespace:
        pods["namespace"] = settings.watch_namespace
        pod_list = as_dicts(api, core.list_namespaced_pod)
    else:
        pod_list = as_dicts(api, core.list_pod_for_all_namespaces)
    targets.append(WatchTarget(name="pods", list_fn=pod_list, kwargs=pods))
    return targets


def handlers(
    *, client: Client, custom: k8s.CustomObjectsApi, settings: Settings
) -> dict[str, Handler]:
    nudgers = {
        entity.plural: Nudger(client=client, custom=custom, settings=settings, entity=entity)
        for entity in (ARTIFACT, CACHE, DEPLOYMENT)
    }
    signals = DeploymentSignals(client=client, custom=custom)

    async def on_artifact(kind: str, obj: dict[str, Any]) -> None:
        await nudgers[ARTIFACT.plural].nudge(kind, obj)
        await signals.artifact_event(kind, obj)

    return {
        ARTIFACT.plural: on_artifact,
        CACHE.plural: nudgers[CACHE.plural].nudge,
        DEPLOYMENT.plural: nudgers[DEPLOYMENT.plural].nudge,
        "pods": signals.pod_event,
    }


async def run_watcher(
    *,
    settings: Settings,
    api: k8s.ApiClient,
    client: Client,
    stop: threading.Event,
    health: WatchHealth,
) -> None:
    custom = k8s.CustomObjectsApi(api)
    handle = handlers(client=client, custom=custom, settings=settings)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, str, dict[str, Any]]] = asyncio.Queue()

    for target in watch_targets(settings=settings, api=api, custom=custom):

        def on_object(kind: str, obj: dict[str, Any], name: str = target.name) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (name, kind, obj))

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
            loop.call_later(NUDGE_RETRY_S, queue.put_nowait, (name, kind, obj))
