"""A worker whose credentials lack one permission: the API server's 403 ends in a
condition that names the object and the missing permission after one attempt, the
workflow waits instead of retrying, and a `retry` signal after the permission is
granted carries on.

The worker runs as a ServiceAccount with the chart's worker rules minus `create` on
pods (RBAC is on in the local stack), on a control queue of its own, with a watcher
of its own for the test's namespace; Kama's shared watchers are paused meanwhile so
that only this worker keeps the ModelDeployment."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from temporalio.api.enums.v1 import EventType, RetryState
from temporalio.client import Client
from temporalio.service import RPCError

from kama.contracts import (
    RETRY,
    DeploymentWorkflowStatus,
    ObjectRef,
    deployment_workflow_id,
    rollout_workflow_id,
)
from kamadev.processes import ManagedProcess
from tests.conftest import KamaControl, _kama_process
from tests.integration.test_artifact_plane import condition
from tests.integration.test_serving_plane import deployment, md, ready_artifact, serving_pods
from tests.support import apply, eventually, get_json, kubectl
from workflows.deployment import DeploymentWorkflow

WORKER_SA = "kama-worker-limited"
CREATE_POD = "Create serving pod"
QUIET_S = 10  # how long nothing may be retried after the 403


def worker_rules(*, pod_verbs: list[str]) -> list[dict[str, Any]]:
    """The chart's namespaced worker rules (deploy/chart/kama/templates/rbac.yaml),
    with `pod_verbs` on pods."""
    return [
        {"apiGroups": [""], "resources": ["pods"], "verbs": pod_verbs},
        {
            "apiGroups": [""],
            "resources": ["persistentvolumeclaims"],
            "verbs": ["create", "delete", "get"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {
            "apiGroups": ["kama.dev"],
            "resources": ["modelartifacts", "modeldeployments"],
            "verbs": ["get", "list", "patch"],
        },
        {"apiGroups": ["kama.dev"], "resources": ["modelcaches"], "verbs": ["get", "patch"]},
        {
            "apiGroups": ["kama.dev"],
            "resources": [
                "modelartifacts/status",
                "modelcaches/status",
                "modeldeployments/status",
                "modeldeployments/scale",
            ],
            "verbs": ["patch"],
        },
        {
            "apiGroups": ["kama.dev"],
            "resources": ["modeldeployments/finalizers"],
            "verbs": ["update"],
        },
    ]


def grant(control: KamaControl, namespace: str, *, pod_verbs: list[str]) -> None:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role"}
    apply(
        control.stack,
        {
            **role,
            "metadata": {"name": WORKER_SA, "namespace": namespace},
            "rules": worker_rules(pod_verbs=pod_verbs),
        },
    )


def limited_kubeconfig(control: KamaControl, namespace: str, path: Path) -> Path:
    """A kubeconfig for the ServiceAccount WORKER_SA: the stack's server and CA, a
    token from the TokenRequest API."""
    cluster_role = f"{WORKER_SA}-{namespace}"
    apply(
        control.stack,
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": WORKER_SA, "namespace": namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": WORKER_SA, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": WORKER_SA},
            "subjects": [{"kind": "ServiceAccount", "name": WORKER_SA, "namespace": namespace}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": cluster_role},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": cluster_role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": cluster_role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": WORKER_SA, "namespace": namespace}],
        },
    )
    grant(control, namespace, pod_verbs=["delete", "get", "list", "patch"])  # no `create`
    token = kubectl(
        control.stack, "create", "token", WORKER_SA, "-n", namespace, "--duration=1h"
    ).stdout.strip()
    config = yaml.safe_load(control.stack.kubeconfig.read_text())
    user = config["contexts"][0]["context"]["user"]
    config["users"] = [{"name": user, "user": {"token": token}}]
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def own_plane(control: KamaControl, namespace: str, kubeconfig: Path) -> Iterator[str]:
    """Kama's shared watchers paused; a worker with `kubeconfig` and a watcher of
    `namespace` on a control queue of their own (its name is yielded)."""
    queue = f"kama-limited-{uuid.uuid4().hex[:6]}"
    # the chart's namespaced mode (worker_rules): it hands the worker no tenant
    # NetworkPolicies to create, and grants no right to create them
    shared = {k: v for k, v in control.env.items() if k != "KAMA_TENANT_NETWORK_POLICIES"}
    env = {**shared, "KAMA_CONTROL_QUEUE": queue, "KAMA_WATCH_NAMESPACE": namespace}
    control.watcher.stop(grace=5)
    control.second_watcher.stop(grace=5)
    own: list[ManagedProcess] = []
    try:
        own.append(
            _kama_process(
                control.stack,
                "worker",
                {**env, "KUBECONFIG": str(kubeconfig)},
                name="worker-limited",
            )
        )
        own.append(_kama_process(control.stack, "watcher", env, name="watcher-limited"))
        yield queue
    finally:
        for process in own:
            process.stop(grace=5)
        control.watcher = _kama_process(control.stack, "watcher", control.env)
        control.second_watcher = _kama_process(
            control.stack, "watcher", control.env, name="watcher-b"
        )


def create_pod_attempts(control: KamaControl, rollout_id: str) -> list[tuple[int, int]]:
    """(attempt, retry state) of each failed `Create serving pod` in a rollout; there
    is one such activity."""

    async def read() -> list[tuple[int, int]]:
        client = await Client.connect(control.stack.temporal.address)
        history = await client.get_workflow_handle(rollout_id).fetch_history()
        scheduled = {
            e.event_id
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name == CREATE_POD
        }
        started = {
            e.event_id: e.activity_task_started_event_attributes.attempt
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
            and e.activity_task_started_event_attributes.scheduled_event_id in scheduled
        }
        failed = [
            e.activity_task_failed_event_attributes
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
            and e.activity_task_failed_event_attributes.scheduled_event_id in scheduled
        ]
        assert len(scheduled) == 1, f"{len(scheduled)} create activities in {rollout_id}"
        return [(started[f.started_event_id], f.retry_state) for f in failed]

    return asyncio.run(read())


def workflow_status(control: KamaControl, workflow_id: str) -> DeploymentWorkflowStatus:
    async def query() -> DeploymentWorkflowStatus:
        client = await Client.connect(control.stack.temporal.address)
        return await client.get_workflow_handle(workflow_id).query(DeploymentWorkflow.status)

    return asyncio.run(query())


def workflow_exists(control: KamaControl, workflow_id: str) -> bool:
    async def describe() -> bool:
        client = await Client.connect(control.stack.temporal.address)
        try:
            await client.get_workflow_handle(workflow_id).describe()
        except RPCError:
            return False
        return True

    return asyncio.run(describe())


def signal_retry(control: KamaControl, workflow_id: str) -> None:
    async def signal() -> None:
        client = await Client.connect(control.stack.temporal.address)
        await client.get_workflow_handle(workflow_id).signal(RETRY)

    asyncio.run(signal())


def test_forbidden_pod_create_is_reported_once_and_waits_for_retry(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    ready_artifact(control, namespace, tmp_path, name="tiny", seed=71)
    kubeconfig = limited_kubeconfig(control, namespace, tmp_path / "limited.kubeconfig")
    try:
        with own_plane(control, namespace, kubeconfig):
            refused_then_retried(control, namespace)
    finally:
        kubectl(
            control.stack,
            "delete",
            "clusterrole,clusterrolebinding",
            f"{WORKER_SA}-{namespace}",
            check=False,
        )


def refused_then_retried(control: KamaControl, namespace: str) -> None:
    apply(
        control.stack,
        deployment(
            namespace,
            "denied",
            "tiny",
            replicas=1,
            runtime={"contextSize": 512},
            resources={"cpu": "100m"},
        ),
    )

    def refused() -> dict[str, Any] | None:
        found = condition(md(control, namespace, "denied"), "RuntimeReady") or {}
        return found if found.get("reason") == "Forbidden" else None

    # the condition names the verb, the resource, the object and the ServiceAccount
    runtime = eventually(refused, timeout=90, what="RuntimeReady reason Forbidden")
    obj = md(control, namespace, "denied")
    fingerprint = obj["status"]["fingerprint"]
    message = runtime["message"]
    assert runtime["status"] == "False"
    assert message.startswith(
        f"forbidden: cannot create pods in namespace {namespace} (pods/denied-{fingerprint}-"
    ), message
    assert f"system:serviceaccount:{namespace}:{WORKER_SA}" in message, message
    assert 'cannot create resource "pods"' in message, message
    assert not serving_pods(control, namespace, "denied")

    # one attempt of the activity, failed as non-retryable
    ref = ObjectRef(namespace=namespace, name="denied", uid=obj["metadata"]["uid"])
    entity, rollout = deployment_workflow_id(ref), rollout_workflow_id(ref, number=1)
    attempts = create_pod_attempts(control, rollout)
    assert [attempt for attempt, _ in attempts] == [1], attempts
    assert attempts[0][1] == RetryState.RETRY_STATE_NON_RETRYABLE_FAILURE

    # nothing retried on a timer: the entity says why and what it waits for
    status = workflow_status(control, entity)
    assert status.last_error and "forbidden: cannot create pods" in status.last_error
    assert "retry" in status.doing, status.doing
    time.sleep(QUIET_S)
    assert len(create_pod_attempts(control, rollout)) == 1
    assert not workflow_exists(control, rollout_workflow_id(ref, number=2))
    assert not serving_pods(control, namespace, "denied")

    # the permission granted and `retry` signalled: the pod is created
    grant(control, namespace, pod_verbs=["create", "delete", "get", "list", "patch"])
    signal_retry(control, entity)
    eventually(
        lambda: serving_pods(control, namespace, "denied") or None,
        timeout=60,
        what="the serving pod after the retry",
    )

    # and the limited worker finalizes the deletion (it may drain and delete pods)
    kubectl(control.stack, "delete", "modeldeployment", "denied", "-n", namespace, "--wait=false")
    eventually(
        lambda: not get_json(control.stack, "modeldeployments", "-n", namespace)["items"],
        timeout=120,
        what="the ModelDeployment finalized by the limited worker",
    )
