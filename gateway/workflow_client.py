"""Every call the gateway makes to Kama's workflows: start (or join) a model's wake,
tell it a replica is ready, report demand to a deployment, report in-flight requests
to a drain, and read a deployment's `status`.

The gateway names workflows, signals and queries by the names `kama.contracts`
defines, and never imports `workflows`: those modules bring the activities, the
planner and the Kubernetes client into a process that only needs their names.
Callers own the policy (RPC timeouts, retries, which errors to ignore); these
functions only say which workflow, which name and which payload."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from kama.api.deployment import MODELDEPLOYMENT_KIND
from kama.contracts import (
    DEMAND,
    GATEWAY_IN_FLIGHT,
    REPLICA_READY,
    STATUS_QUERY,
    WAKE_WORKFLOW,
    DemandReport,
    DeploymentWorkflowStatus,
    DrainReport,
    ObjectRef,
    WakeInput,
    deployment_workflow_id,
    drain_workflow_id,
    entity_search_attributes,
    wake_workflow_id,
)


def _wake_id(deployment: ObjectRef) -> str:
    return wake_workflow_id(
        cluster=deployment.cluster, namespace=deployment.namespace, name=deployment.name
    )


async def start_wake(
    client: Client,
    *,
    deployment: ObjectRef,
    timeout_s: float,
    task_queue: str,
    rpc_timeout: timedelta,
) -> str | None:
    """Start the wake of `deployment`, or join the one running (one per model, so a
    burst of first requests starts one); the run started or joined."""
    handle = await client.start_workflow(
        WAKE_WORKFLOW,
        WakeInput(ref=deployment, timeout_s=timeout_s),
        id=_wake_id(deployment),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        search_attributes=entity_search_attributes(
            kind=MODELDEPLOYMENT_KIND, namespace=deployment.namespace, name=deployment.name
        ),
        rpc_timeout=rpc_timeout,
    )
    return handle.run_id


async def tell_replica_ready(
    client: Client, *, deployment: ObjectRef, run_id: str, rpc_timeout: timedelta
) -> None:
    """Tell that run of the wake (only that one: a later wake of the same model must not
    end early) that a replica is ready."""
    handle = client.get_workflow_handle(_wake_id(deployment), run_id=run_id)
    await handle.signal(REPLICA_READY, rpc_timeout=rpc_timeout)


async def report_demand(
    client: Client, *, deployment: ObjectRef, report: DemandReport, rpc_timeout: timedelta
) -> None:
    handle = client.get_workflow_handle(deployment_workflow_id(deployment))
    await handle.signal(DEMAND, report, rpc_timeout=rpc_timeout)


async def report_drain(
    client: Client,
    *,
    cluster: str,
    namespace: str,
    pod: str,
    report: DrainReport,
    rpc_timeout: timedelta,
) -> None:
    handle = client.get_workflow_handle(
        drain_workflow_id(cluster=cluster, namespace=namespace, pod=pod)
    )
    await handle.signal(GATEWAY_IN_FLIGHT, report, rpc_timeout=rpc_timeout)


async def deployment_status(
    client: Client, *, deployment: ObjectRef, rpc_timeout: timedelta
) -> DeploymentWorkflowStatus:
    handle = client.get_workflow_handle(deployment_workflow_id(deployment))
    status: DeploymentWorkflowStatus = await handle.query(
        STATUS_QUERY, result_type=DeploymentWorkflowStatus, rpc_timeout=rpc_timeout
    )
    return status
