"""A draining pod's drain workflow waits for this gateway's requests still in flight
there (llama-server's busy slots do not show a request that is still on its way in,
or queued behind its HTTP threads): the registry notes, when a pod with requests in
flight here starts leaving and again when its last one ends, and this task signals the
pod's `drain/<ns>/<pod>` workflow with the count."""

from __future__ import annotations

import logging
from datetime import timedelta

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gateway.clock import MONOTONIC, Clock
from gateway.registry import ModelRegistry
from gateway.workflow_client import report_drain
from kama.contracts import DrainReport

log = logging.getLogger("kama.gateway")

SIGNAL_RPC_TIMEOUT = timedelta(seconds=2)
ATTEMPTS = 5  # then the drain's own timeout decides
RETRY_DELAY_S = 1.0


async def report_drains(
    *,
    registry: ModelRegistry,
    client: Client,
    cluster: str,
    gateway: str,
    clock: Clock = MONOTONIC,
) -> None:
    while True:
        await registry.drain_noticed.wait()
        registry.drain_noticed.clear()
        while registry.drain_notices:
            namespace, pod, in_flight = registry.drain_notices.popleft()
            await _signal(
                client,
                cluster=cluster,
                namespace=namespace,
                pod=pod,
                report=DrainReport(gateway=gateway, in_flight=in_flight),
                clock=clock,
            )


async def _signal(
    client: Client, *, cluster: str, namespace: str, pod: str, report: DrainReport, clock: Clock
) -> None:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            await report_drain(
                client,
                cluster=cluster,
                namespace=namespace,
                pod=pod,
                report=report,
                rpc_timeout=SIGNAL_RPC_TIMEOUT,
            )
            return
        except Exception as exc:  # Temporal away, or the signal refused
            if isinstance(exc, RPCError) and exc.status == RPCStatusCode.NOT_FOUND:
                return  # not a drain (the pod crashed or was deleted by hand)
            log.warning(
                "telling the drain of %s/%s about in-flight requests failed: %s",
                namespace,
                pod,
                exc,
            )
        if attempt < ATTEMPTS:
            await clock.sleep(RETRY_DELAY_S * attempt)
