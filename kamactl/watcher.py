"""Wiring of `kama watcher`: build the Kubernetes and Temporal clients, run the
watches until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import signal
import threading

from informer.watch import WatchHealth
from kama.config import Settings
from kamactl.clients import connect_temporal, kube_api
from kamactl.telemetry import install_temporal_metrics, serve_metrics
from watcher.health import serve_health
from watcher.main import run_watcher
from watcher.metrics import WatcherMetrics


async def run_watcher_process(settings: Settings) -> None:
    stop = threading.Event()
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        stop.set()
        done.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    health = WatchHealth()
    server = serve_health(health=health, host=settings.health_host, port=settings.health_port)
    metrics = WatcherMetrics(health=health)
    endpoint = serve_metrics(
        registry=metrics.registry, host=settings.health_host, port=settings.metrics_port
    )
    install_temporal_metrics(host=settings.health_host, port=settings.temporal_metrics_port)
    client = await connect_temporal(settings)
    task = asyncio.create_task(
        run_watcher(
            settings=settings,
            api=kube_api(),
            client=client,
            stop=stop,
            health=health,
            metrics=metrics,
        )
    )
    await done.wait()
    await task
    server.shutdown()
    if endpoint is not None:
        endpoint.close()
