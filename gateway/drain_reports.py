"""A draining pod's drain workflow waits for this gateway's requests still in flight
there (llama-server's busy slots do not show a request that is still on its way in,
or queued behind its HTTP threads): the registry notes, when a pod with requests in
flight here starts leaving and again when its last one ends, and this task signals the
pod's `drain/<ns>/<pod>` workflow with the count."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gateway.registry import ModelRegistry
from kama.contracts import DrainReport, drain_workflow_id
from workflows.drain import DrainWorkflow

log = logging.getLogger("kama.gateway")

SIGNAL_RPC_TIMEOUT = timedelta(seconds=2)
ATTEMPTS = 5  # then the drain's own timeout decides
RETRY_DELAY_S = 1.0


async def report_drains(
    *, registry: ModelRegistry, client: Client, cluster: str, gateway: str
) -> None:
    while True:
        await registry.drain_noticed.wait()
        registry.drain_noticed.clear()
        while registry.drain_notices:
            namespace, pod, in_flight = registry.drain_notices.popleft()
            workflow_id = drain_workflow_id(cluster=cluster, namespace=namespace, pod=pod)
            await _signal(client, workflow_id, DrainReport(gateway=gateway, in_flight=in_flight))


async def _signal(client: Client, workflow_id: str, report: DrainReport) -> None:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            await client.get_workflow_handle(workflow_id).signal(
                DrainWorkflow.gateway_in_flight, report, rpc_timeout=SIGNAL_RPC_TIMEOUT
            )
            return
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return  # not a drain (the pod crashed or was deleted by hand)
            log.warning("telling %s about in-flight requests failed: %s", workflow_id, exc)
        except Exception as exc:  # Temporal away
            log.warning("telling %s about in-flight requests failed: %s", workflow_id, exc)
        if attempt < ATTEMPTS:
            await asyncio.sleep(RETRY_DELAY_S * attempt)
