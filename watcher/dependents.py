"""Events that matter to a ModelDeployment but are not its own: its serving pods
(ready, crashed, deleted) and its artifact (became Ready, changed). The watcher
signals the deployment's workflow so it reacts at once instead of at its next
resync; a workflow that does not exist (yet, or any more) is simply skipped."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from kama.api import GROUP, VERSION
from kama.api.deployment import artifacts_named
from kama.contracts import (
    ARTIFACT_CHANGED,
    DEPLOYMENTS,
    PODS_CHANGED,
    ObjectRef,
    deployment_workflow_id,
)
from watcher.metrics import WatcherMetrics
from watcher.nudge import DEPLOYMENT
from workflows.deployment import DeploymentWorkflow

DeploymentSignal = Callable[[DeploymentWorkflow], None]

log = logging.getLogger("kama.watcher")


class DeploymentSignals:
    def __init__(
        self,
        *,
        client: Client,
        custom: k8s.CustomObjectsApi,
        cluster: str,
        metrics: WatcherMetrics | None = None,
    ) -> None:
        self.client = client
        self.custom = custom
        self.cluster = cluster  # deployments are this cluster's workflows
        self.metrics = metrics or WatcherMetrics()

    async def _signal(
        self, *, namespace: str, name: str, uid: str, signal: DeploymentSignal, label: str
    ) -> None:
        workflow_id = deployment_workflow_id(
            ObjectRef(namespace=namespace, name=name, uid=uid, cluster=self.cluster)
        )
        try:
            await self.client.get_workflow_handle(workflow_id).signal(signal)
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                self.metrics.signalled(signal=label, outcome="error")
                raise
            self.metrics.signalled(signal=label, outcome="not_found")
            log.debug("%s: no running workflow for %s", workflow_id, signal)
            return
        except Exception:
            self.metrics.signalled(signal=label, outcome="error")
            raise
        self.metrics.signalled(signal=label, outcome="ok")

    async def pod_event(self, _event_type: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata", {})
        for owner in meta.get("ownerReferences") or []:
            if owner.get("kind") == DEPLOYMENT.kind and owner.get("controller"):
                await self._signal(
                    namespace=meta["namespace"],
                    name=owner["name"],
                    uid=owner["uid"],
                    signal=DeploymentWorkflow.pods_changed,
                    label=PODS_CHANGED,
                )

    async def artifact_event(self, event_type: str, artifact: dict[str, Any]) -> None:
        """A Ready (or deleted) artifact nudges the deployments that name it (as their
        model or their draft model)."""
        meta, status = artifact.get("metadata", {}), artifact.get("status") or {}
        if event_type != "DELETED" and status.get("phase") != "Ready":
            return
        namespace = meta["namespace"]
        try:
            items = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, DEPLOYMENTS
            )["items"]
        except k8s.ApiException as exc:
            if exc.status == 404:
                return
            raise
        for item in items:
            if meta["name"] in artifacts_named(item.get("spec") or {}):
                await self._signal(
                    namespace=namespace,
                    name=item["metadata"]["name"],
                    uid=item["metadata"]["uid"],
                    signal=DeploymentWorkflow.artifact_changed,
                    label=ARTIFACT_CHANGED,
                )
