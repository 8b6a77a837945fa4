"""Demand reaches each DeploymentWorkflow as a rate-limited `demand` signal: at most
one per model per interval, sent while the model had requests or still has some
in flight (a long stream keeps reporting). Every gateway replica reports on its
own; the workflow only keeps the latest time. Nothing here is state the workflow
depends on: a gateway that restarts or stops simply stops reporting, and the
model then idles down after its idleTimeout (the workflow also checks busy slots
itself before scaling to zero); a request for a model at zero starts a wake."""

from __future__ import annotations

import asyncio
import logging
import socket
from datetime import timedelta

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gateway.registry import ModelRegistry
from kama.contracts import DemandReport, ObjectRef, deployment_workflow_id
from workflows.deployment import DeploymentWorkflow

log = logging.getLogger("kama.gateway")

REPORT_INTERVAL_S = 2.0
# a stalled Temporal must not stall the reports of every other model behind one call
REPORT_RPC_TIMEOUT = timedelta(seconds=2)


async def report_demand(*, registry: ModelRegistry, client: Client) -> None:
    gateway = socket.gethostname()
    while True:
        await asyncio.sleep(REPORT_INTERVAL_S)
        for model in list(registry.models.values()):
            if not (model.requests_since_report or model.in_flight):
                continue
            model.requests_since_report = 0
            workflow_id = deployment_workflow_id(
                ObjectRef(namespace=model.namespace, name=model.name, uid=model.uid)
            )
            try:
                await client.get_workflow_handle(workflow_id).signal(
                    DeploymentWorkflow.demand,
                    DemandReport(gateway=gateway, in_flight=model.in_flight),
                    rpc_timeout=REPORT_RPC_TIMEOUT,
                )
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    log.warning("reporting demand for %s failed: %s", model.key, exc)
            except Exception as exc:  # Temporal away: report again next period
                log.warning("reporting demand for %s failed: %s", model.key, exc)
