"""Wiring of the Temporal worker processes (`kama worker`, `kama importer`): one
function each that builds the clients, registers workflows and activities, and runs
until SIGTERM."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.worker import Worker

from kama.config import Settings
from kama.importer_pod import ImporterTemplate
from kamactl.clients import connect_temporal, kube_api
from kamactl.importer_relays import ImporterRelays
from kamactl.serving_key_secret import ensure_serving_key, parse_secret_ref
from kamactl.telemetry import install_temporal_metrics
from kamactl.workflow_counts import worker_metrics, workflow_type_names

log = logging.getLogger("kama")

LLAMA_PROBE_TIMEOUT_S = 3.0  # connect and each read; the whole read has its own deadline
# Activities at once on each worker, and the threads that run them: Temporal hands a
# worker up to max_concurrent_activities tasks (100 by default), and a sync activity
# beyond the pool's threads would wait unseen while its timeouts run
CONTROL_ACTIVITY_SLOTS = 16


def _stop_on_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def run_worker(settings: Settings) -> None:
    from activities.workflow_provenance import KamaWorkflowsOnly
    from workflows.artifact import ArtifactWorkflow
    from workflows.cache import CacheWorkflow
    from workflows.deployment import DeploymentWorkflow
    from workflows.drain import DrainWorkflow
    from workflows.entity_identity import StartedByKama
    from workflows.import_model import ImportWorkflow
    from workflows.import_watch import ImportWatchWorkflow
    from workflows.rollout import RolloutWorkflow
    from workflows.verify_model import VerifyWorkflow
    from workflows.wake import WakeWorkflow

    # before the first client: the SDK's metrics go to the runtime it connects with
    install_temporal_metrics(host=settings.health_host, port=settings.temporal_metrics_port)
    client = await connect_temporal(settings)
    api = kube_api()
    settings = await with_serving_key(settings, api=api)
    with httpx.Client() as unused:  # the relays read only the activities' declarations
        declared = importer_activities(http=unused, hf_endpoint="")
    relays = ImporterRelays(
        client=client,
        api=api,
        tenancy=settings.tenancy,
        cluster=settings.cluster,
        importer_functions=declared,
        master_key=settings.serving_key,
    )
    if settings.serving_key is None:
        log.warning(
            "KAMA_SERVING_KEY is not set: serving pods' llama-server requires no API key, "
            "so any pod that reaches one can use its model and its admin routes"
        )
    activities = control_activities(settings=settings, api=api, client=client)
    stop = asyncio.Event()
    _stop_on_signals(asyncio.get_running_loop(), stop)
    workflows: list[type] = [
        ArtifactWorkflow,
        CacheWorkflow,
        ImportWorkflow,
        ImportWatchWorkflow,
        VerifyWorkflow,
        DeploymentWorkflow,
        RolloutWorkflow,
        DrainWorkflow,
        WakeWorkflow,
    ]
    provenance = KamaWorkflowsOnly(
        client=client,
        task_queue=settings.control_task_queue,
        workflow_types=workflow_type_names(workflows),
    )
    with ThreadPoolExecutor(max_workers=CONTROL_ACTIVITY_SLOTS) as pool:
        worker = Worker(
            client,
            task_queue=settings.control_task_queue,
            max_concurrent_activities=CONTROL_ACTIVITY_SLOTS,
            interceptors=[provenance, StartedByKama()],
            workflows=workflows,
            activities=activities,
            activity_executor=pool,
        )
        async with (
            worker,
            worker_metrics(
                client=client,
                settings=settings,
                task_queue=settings.control_task_queue,
                workflows=worker.config()["workflows"],
            ),
        ):
            log.info(
                "worker polling %s on %s (namespace %s)",
                settings.control_task_queue,
                client.service_client.config.target_host,
                client.namespace,
            )
            relaying = asyncio.create_task(relays.run(stop))
            await stop.wait()
            await relaying


async def with_serving_key(settings: Settings, *, api: k8s.ApiClient) -> Settings:
    """`settings` with the master key read from (or first created in) the Secret
    `KAMA_SERVING_KEY_SECRET` names, unless `KAMA_SERVING_KEY` gives it."""
    if settings.serving_key is not None or settings.serving_key_secret is None:
        return settings
    namespace, name = parse_secret_ref(settings.serving_key_secret)
    key = await asyncio.to_thread(
        ensure_serving_key,
        k8s.CoreV1Api(api),
        namespace=namespace,
        name=name,
        field=settings.serving_key_field,
        generate=settings.serving_key_generate,
    )
    return dataclasses.replace(settings, serving_key=key)


def control_activities(
    *, settings: Settings, api: k8s.ApiClient, client: Client
) -> list[Callable[..., Any]]:
    """Every activity of Kama's control queue, built as the worker builds them (the
    trust-boundary stack tests run them in-process with the worker's settings)."""
    from activities.keda import KedaActivities
    from activities.kube import KubeActivities
    from activities.llama_server import LlamaServerActivities
    from activities.progress import ProgressActivities
    from activities.serving_pods import ServingPodActivities
    from activities.tenant_fence import TenantFence

    fence = TenantFence(api=api, policies=settings.tenant_network_policies)
    kube = KubeActivities(
        api=api,
        importer=ImporterTemplate(
            image=settings.importer_image,
            hf_endpoint=settings.hf_endpoint,
            options=settings.importer_pod,
        ),
        tenancy=settings.tenancy,
        master_key=settings.serving_key,
        fence=fence,
    )
    progress = ProgressActivities(client=client)
    serving = ServingPodActivities(
        api=api,
        runtime_images=settings.runtime_images,
        tenancy=settings.tenancy,
        serving_key=settings.serving_key,
        fence=fence,
    )
    keda = KedaActivities(
        api=api, scaler_address=settings.keda_scaler_address, tenancy=settings.tenancy
    )
    llama = LlamaServerActivities(
        http=httpx.AsyncClient(timeout=LLAMA_PROBE_TIMEOUT_S),
        api=api,
        tenancy=settings.tenancy,
        serving_key=settings.serving_key,
    )
    return [
        kube.patch_status,
        kube.read_object,
        kube.record_event,
        kube.cache_claim,
        kube.expand_cache_claim,
        kube.source_claim,
        kube.ensure_importer_pod,
        kube.delete_pod,
        kube.artifact_users,
        kube.cache_users,
        kube.delete_cache_claim,
        kube.release_finalizer,
        progress.import_progress,
        serving.read_inputs,
        serving.list_pods,
        serving.create_pod,
        serving.mark_draining,
        serving.delete_pod,
        serving.set_replicas,
        keda.apply_scaled_object,
        keda.delete_scaled_object,
        llama.busy_slots,
    ]


def importer_activities(*, http: httpx.Client, hf_endpoint: str) -> list[Callable[..., Any]]:
    """Everything that runs next to a volume: sources, hashing, publication (served by
    `kama importer`; their declared types are what the worker's relays check)."""
    from activities.cache import CacheActivities
    from activities.huggingface import HuggingFaceActivities
    from activities.volume_source import PvcSourceActivities

    hf = HuggingFaceActivities(http=http, endpoint=hf_endpoint)
    cache = CacheActivities()
    volume = PvcSourceActivities()
    return [
        hf.resolve_source,
        hf.download_file,
        cache.ensure_space,
        cache.prepare_staging,
        cache.lookup,
        cache.publish,
        cache.discard_staging,
        cache.verify_published,
        volume.resolve,
        volume.copy_file,
        volume.verify_in_place,
    ]


async def run_importer(settings: Settings, *, host: str, token: str) -> None:
    """Serve the importer activities to the worker on `host` (the pod IP) until SIGTERM.
    No Temporal client: the worker relays the operation's tasks here."""
    from kama.importer_protocol import IMPORTER_PORT
    from kamactl.importer_server import serve_importer

    stop = asyncio.Event()
    _stop_on_signals(asyncio.get_running_loop(), stop)
    with httpx.Client(timeout=httpx.Timeout(60, connect=10), follow_redirects=True) as http:
        server = serve_importer(
            host=host,
            port=IMPORTER_PORT,
            functions=importer_activities(http=http, hf_endpoint=settings.hf_endpoint),
            token=token,
        )
        log.info("importer serving on %s:%d (pid %d)", host, IMPORTER_PORT, os.getpid())
        try:
            await stop.wait()
        finally:
            await asyncio.to_thread(server.shutdown)
