"""`kama status`: list Kama's resources through the API server and ask each one's
workflow what it is doing (its `status` query), concurrently, with a deadline per
workflow so one unanswered query does not hold up the table.

The workflow is the one the resource's status names (`status.workflowID`, written
by the workflow itself), else the ID the contract builds from the resource (a
resource whose workflow has not written its status yet). A workflow that does not
exist, has ended, or whose query times out (no worker polling) still gets its row,
with the reason instead of an answer."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from kama.api.meta import GROUP, VERSION
from kama.config import Settings
from kama.contracts import (
    ARTIFACTS,
    CACHES,
    DEPLOYMENTS,
    STATUS_QUERY,
    ObjectRef,
    artifact_workflow_id,
    cache_workflow_id,
    deployment_workflow_id,
)
from kamactl.clients import connect_temporal, kube_api
from kamactl.status_report import (
    ResourceStatus,
    render_json,
    render_table,
    row_for,
    written_workflow_id,
)

QUERY_TIMEOUT: Final = timedelta(seconds=5)
CONCURRENT_QUERIES: Final = 16
CONNECT_TIMEOUT_S: Final = 15.0
IN_CLUSTER_NAMESPACE_FILE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    workflow_id: Callable[[ObjectRef], str]


KINDS: Final = (
    Kind("ModelCache", CACHES, cache_workflow_id),
    Kind("ModelArtifact", ARTIFACTS, artifact_workflow_id),
    Kind("ModelDeployment", DEPLOYMENTS, deployment_workflow_id),
)


def current_namespace() -> str:
    """kubectl's default namespace: the kubeconfig context's, the pod's, or default."""
    try:
        _, active = k8s_config.list_kube_config_contexts()
        namespace = (active or {}).get("context", {}).get("namespace")
        if namespace:
            return str(namespace)
    except (k8s_config.ConfigException, OSError):
        pass
    try:
        with open(IN_CLUSTER_NAMESPACE_FILE, encoding="utf-8") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def list_resources(
    *, api: k8s.ApiClient, namespace: str | None
) -> list[tuple[Kind, dict[str, Any]]]:
    """Every cache, artifact and deployment in `namespace` (None: all), sorted by kind,
    namespace and name; a kind whose CRD is not installed has none."""
    custom = k8s.CustomObjectsApi(api)
    found: list[tuple[Kind, dict[str, Any]]] = []
    for kind in KINDS:
        try:
            if namespace is None:
                listing = custom.list_cluster_custom_object(GROUP, VERSION, kind.plural)
            else:
                listing = custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, kind.plural
                )
        except k8s.ApiException as exc:
            if exc.status == 404:
                continue
            raise
        items = sorted(
            listing.get("items", []),
            key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]),
        )
        found.extend((kind, item) for item in items)
    return found


def workflow_id_for(*, kind: Kind, obj: Mapping[str, Any], cluster: str) -> str:
    """The ID the resource's status names, else the one its contract builds."""
    if written := written_workflow_id(obj):
        return written
    meta = obj["metadata"]
    return kind.workflow_id(
        ObjectRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], cluster=cluster)
    )


def state_name(status: WorkflowExecutionStatus | None) -> str:
    """RUNNING → Running, CONTINUED_AS_NEW → ContinuedAsNew (Temporal UI's words)."""
    if status is None:
        return "Unknown"
    return "".join(part.capitalize() for part in status.name.split("_"))


async def ask_workflow(
    *, client: Client, workflow_id: str
) -> tuple[str, Mapping[str, Any] | None, str | None]:
    """(state, `status` answer or None, why there is no answer)."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        described = await handle.describe(rpc_timeout=QUERY_TIMEOUT)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return "NotFound", None, "no workflow (the watcher starts one on the next event)"
        return "Unknown", None, f"describe failed: {exc.message}"
    state = state_name(described.status)
    if described.status != WorkflowExecutionStatus.RUNNING:
        return state, None, f"workflow {state.lower()}"
    try:
        answer = await handle.query(STATUS_QUERY, rpc_timeout=QUERY_TIMEOUT)
    except RPCError as exc:
        if exc.status == RPCStatusCode.DEADLINE_EXCEEDED:
            return state, None, "status query timed out (is a worker polling?)"
        return state, None, f"status query failed: {exc.message}"
    except Exception as exc:  # the query itself failed in the workflow
        return state, None, f"status query failed: {exc}"
    return state, answer if isinstance(answer, Mapping) else None, None


async def collect_statuses(
    *, client: Client | None, resources: Sequence[tuple[Kind, dict[str, Any]]], cluster: str
) -> list[ResourceStatus]:
    """One row per resource; without a client (Temporal unreachable) rows say so."""
    limit = asyncio.Semaphore(CONCURRENT_QUERIES)

    async def one(kind: Kind, obj: dict[str, Any]) -> ResourceStatus:
        workflow_id = workflow_id_for(kind=kind, obj=obj, cluster=cluster)
        if client is None:
            return row_for(
                kind=kind.kind,
                obj=obj,
                workflow_id=workflow_id,
                state="Unknown",
                answer=None,
                note="Temporal unreachable",
            )
        async with limit:
            state, answer, note = await ask_workflow(client=client, workflow_id=workflow_id)
        return row_for(
            kind=kind.kind, obj=obj, workflow_id=workflow_id, state=state, answer=answer, note=note
        )

    return list(await asyncio.gather(*(one(kind, obj) for kind, obj in resources)))


async def gather_status(
    *,
    settings: Settings,
    api: k8s.ApiClient,
    connect: Callable[[], Any],
    namespace: str | None,
) -> tuple[list[ResourceStatus], str | None]:
    """The rows, and a warning when Temporal could not be reached (then every row
    has the resource's side only)."""
    resources = list_resources(api=api, namespace=namespace)
    client: Client | None = None
    warning = None
    if resources:
        try:
            client = await asyncio.wait_for(connect(), timeout=CONNECT_TIMEOUT_S)
        except Exception as exc:
            warning = f"cannot reach Temporal ({exc}); showing the resources only"
    rows = await collect_statuses(client=client, resources=resources, cluster=settings.cluster)
    return rows, warning


async def run_status(*, settings: Settings, namespace: str | None, output: str) -> int:
    """`kama status`: print the table (or JSON) on stdout; 0, or 1 when the API server
    could not be read."""
    try:
        rows, warning = await gather_status(
            settings=settings,
            api=kube_api(),
            connect=lambda: connect_temporal(settings, check=False),
            namespace=namespace,
        )
    except (k8s.ApiException, k8s_config.ConfigException, OSError) as exc:
        print(f"kama status: cannot list Kama resources: {exc}", file=sys.stderr)
        return 1
    if warning:
        print(f"kama status: {warning}", file=sys.stderr)
    print(render_json(rows) if output == "json" else render_table(rows, now=datetime.now(UTC)))
    return 0
