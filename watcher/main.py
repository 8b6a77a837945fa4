"""`kama watcher`: list+watch Kama's resources and nudge their workflows."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client

from activities.workers import kube_api
from kama.api import GROUP, VERSION
from kama.config import Settings
from watcher.nudge import ARTIFACT, CACHE, Nudger
from watcher.watch import WatchTarget, run_watch

log = logging.getLogger("kama.watcher")

NUDGE_RETRY_S = 2.0


async def run_watcher(*, settings: Settings, api: k8s.ApiClient, stop: threading.Event) -> None:
    client = await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace)
    custom = k8s.CustomObjectsApi(api)
    nudgers = {
        entity.plural: Nudger(
            client=client, custom=custom, task_queue=settings.control_queue, entity=entity
        )
        for entity in (ARTIFACT, CACHE)
    }
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, str, dict[str, Any]]] = asyncio.Queue()

    for plural in nudgers:

        def on_object(kind: str, obj: dict[str, Any], plural: str = plural) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (plural, kind, obj))

        kwargs: dict[str, Any] = {"group": GROUP, "version": VERSION, "plural": plural}
        if settings.watch_namespace:
            target = WatchTarget(
                name=plural,
                list_fn=custom.list_namespaced_custom_object,
                kwargs={**kwargs, "namespace": settings.watch_namespace},
            )
        else:
            target = WatchTarget(
                name=plural, list_fn=custom.list_cluster_custom_object, kwargs=kwargs
            )
        threading.Thread(
            target=run_watch,
            kwargs={"target": target, "on_object": on_object, "stop": stop},
            daemon=True,
        ).start()
    while not stop.is_set():
        try:
            plural, kind, obj = await asyncio.wait_for(queue.get(), timeout=1)
        except TimeoutError:
            continue
        try:
            await nudgers[plural].nudge(kind, obj)
        except Exception:
            log.exception("nudging %s failed; retrying", obj.get("metadata", {}).get("name"))
            loop.call_later(NUDGE_RETRY_S, queue.put_nowait, (plural, kind, obj))


async def run_watcher_process(settings: Settings) -> None:
    stop = threading.Event()
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        stop.set()
        done.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    task = asyncio.create_task(run_watcher(settings=settings, api=kube_api(), stop=stop))
    await done.wait()
    await task
