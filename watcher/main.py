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
from watcher.artifacts import ArtifactNudger
from watcher.watch import WatchTarget, run_watch

log = logging.getLogger("kama.watcher")

NUDGE_RETRY_S = 2.0


async def run_watcher(*, settings: Settings, api: k8s.ApiClient, stop: threading.Event) -> None:
    client = await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace)
    custom = k8s.CustomObjectsApi(api)
    nudger = ArtifactNudger(client=client, custom=custom, task_queue=settings.control_queue)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()

    def on_object(kind: str, obj: dict[str, Any]) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (kind, obj))

    kwargs: dict[str, Any] = {"group": GROUP, "version": VERSION, "plural": "modelartifacts"}
    if settings.watch_namespace:
        target = WatchTarget(
            name="modelartifacts",
            list_fn=custom.list_namespaced_custom_object,
            kwargs={**kwargs, "namespace": settings.watch_namespace},
        )
    else:
        target = WatchTarget(
            name="modelartifacts", list_fn=custom.list_cluster_custom_object, kwargs=kwargs
        )
    thread = threading.Thread(
        target=run_watch,
        kwargs={"target": target, "on_object": on_object, "stop": stop},
        daemon=True,
    )
    thread.start()
    while not stop.is_set():
        try:
            kind, obj = await asyncio.wait_for(queue.get(), timeout=1)
        except TimeoutError:
            continue
        try:
            await nudger.nudge(kind, obj)
        except Exception:
            log.exception(
                "nudging %s failed; the next event or re-list retries",
                obj.get("metadata", {}).get("name"),
            )


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
