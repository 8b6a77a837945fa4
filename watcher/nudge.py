"""Kama resource events → their entity workflows.

On first sight the watcher adds Kama's finalizer (so deletion waits for the
workflow), then signal-with-starts `<prefix>/<ns>/<name>/<uid>` with the latest
spec. Workflow IDs are deterministic and the signal is an idempotent nudge, so any
number of watchers may run at once.

An event that changes nothing a workflow reads (a status write, most often the
workflow's own) is not signalled: the snapshot it would carry has the generation and
deletion state of the last one sent for that object. Otherwise every status write
would come back to its workflow as a signal, and its history would grow with its
writes. Such an event still nudges once `RENUDGE_AFTER_S` has passed since the last
nudge of the object, so a workflow ended by hand is restarted by the next event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client

from kama.api import FINALIZER, GROUP, VERSION
from kama.config import Settings
from kama.contracts import (
    ARTIFACTS,
    CACHES,
    DEPLOYMENTS,
    SPEC_CHANGED,
    EntitySnapshot,
    ObjectRef,
    artifact_workflow_id,
    cache_workflow_id,
    deployment_workflow_id,
    entity_search_attributes,
)
from workflows.artifact import ArtifactInput, ArtifactWorkflow
from workflows.cache import CacheInput, CacheWorkflow
from workflows.deployment import DeploymentInput, DeploymentWorkflow

log = logging.getLogger("kama.watcher")

RENUDGE_AFTER_S = 600.0


@dataclass(frozen=True)
class EntityKind:
    kind: str
    plural: str
    workflow_id: Callable[[ObjectRef], str]
    run: Any  # the entity workflow's run method
    make_input: Callable[[EntitySnapshot, Settings], Any]
    summary: Callable[[dict[str, Any]], str]


def snapshot_of(obj: dict[str, Any], *, cluster: str) -> EntitySnapshot:
    meta = obj["metadata"]
    return EntitySnapshot(
        ref=ObjectRef(
            namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], cluster=cluster
        ),
        generation=int(meta.get("generation", 1)),
        spec=obj.get("spec", {}),
        deleting=meta.get("deletionTimestamp") is not None,
    )


def artifact_summary(spec: dict[str, Any]) -> str:
    source = spec.get("source", {})
    if "huggingFace" in source:
        hf = source["huggingFace"]
        return f"huggingFace {hf.get('repo')}@{hf.get('revision', 'main')} {','.join(hf.get('files', []))}"
    pvc = source.get("persistentVolumeClaim", {})
    return f"pvc {pvc.get('claimName')}:{pvc.get('path')} ({pvc.get('mode', 'Copy')})"


def cache_summary(spec: dict[str, Any]) -> str:
    if "persistentVolumeClaim" in spec:
        return f"existing claim {spec['persistentVolumeClaim'].get('claimName')}"
    template = spec.get("claimTemplate", {})
    return f"claim template {template.get('size')} ({spec.get('retentionPolicy', 'Retain')})"


ARTIFACT = EntityKind(
    kind="ModelArtifact",
    plural=ARTIFACTS,
    workflow_id=artifact_workflow_id,
    run=ArtifactWorkflow.run,
    make_input=lambda snap, _settings: ArtifactInput(snapshot=snap),
    summary=artifact_summary,
)
CACHE = EntityKind(
    kind="ModelCache",
    plural=CACHES,
    workflow_id=cache_workflow_id,
    run=CacheWorkflow.run,
    make_input=lambda snap, _settings: CacheInput(snapshot=snap),
    summary=cache_summary,
)


def deployment_summary(spec: dict[str, Any]) -> str:
    runtime = spec.get("runtime", {})
    return (
        f"model {spec.get('modelRef', {}).get('name')}, "
        f"context {runtime.get('contextSize', 'native')} x {runtime.get('concurrency', 1)}, "
        f"placement {spec.get('placement', {}).get('mode', 'Auto')}"
    )


DEPLOYMENT = EntityKind(
    kind="ModelDeployment",
    plural=DEPLOYMENTS,
    workflow_id=deployment_workflow_id,
    run=DeploymentWorkflow.run,
    make_input=lambda snap, settings: DeploymentInput(
        snapshot=snap, runtime_image=settings.runtime_image
    ),
    summary=deployment_summary,
)


class Nudger:
    def __init__(
        self,
        *,
        client: Client,
        custom: k8s.CustomObjectsApi,
        settings: Settings,
        entity: EntityKind,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.custom = custom
        self.settings = settings
        self.task_queue = settings.control_task_queue
        self.entity = entity
        self._clock = clock
        # uid -> (generation, deleting) last signalled, and when
        self._nudged: dict[str, tuple[tuple[int, bool], float]] = {}

    def ensure_finalizer(self, obj: dict[str, Any]) -> bool:
        """Add the finalizer unless present or deleting; False if the object is gone."""
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") or FINALIZER in (meta.get("finalizers") or []):
            return True
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
            {
                "op": "add",
                "path": "/metadata/finalizers",
                "value": [*(meta.get("finalizers") or []), FINALIZER],
            },
        ]
        try:
            self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                meta["namespace"],
                self.entity.plural,
                meta["name"],
                patch,
                _content_type="application/json-patch+json",
            )
        except k8s.ApiException as exc:
            if exc.status in (404, 422):  # gone, or replaced by a new object: its own event follows
                return False
            raise
        return True

    def _unchanged(self, snap: EntitySnapshot) -> bool:
        """Whether the workflow was last sent a snapshot of this object with the same
        generation and deletion state, recently."""
        last = self._nudged.get(snap.ref.uid)
        return (
            last is not None
            and last[0] == (snap.generation, snap.deleting)
            and self._clock() - last[1] < RENUDGE_AFTER_S
        )

    async def nudge(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "DELETED":
            self._nudged.pop(obj.get("metadata", {}).get("uid", ""), None)
            return  # the finalizer guarantees the workflow saw the deletion first
        if not self.ensure_finalizer(obj):
            return
        snap = snapshot_of(obj, cluster=self.settings.cluster)
        if self._unchanged(snap):
            return
        await self.client.start_workflow(
            self.entity.run,
            self.entity.make_input(snap, self.settings),
            id=self.entity.workflow_id(snap.ref),
            task_queue=self.task_queue,
            start_signal=SPEC_CHANGED,
            start_signal_args=[snap],
            search_attributes=entity_search_attributes(
                kind=self.entity.kind, namespace=snap.ref.namespace, name=snap.ref.name
            ),
            memo={"spec": self.entity.summary(snap.spec)},
        )
        self._nudged[snap.ref.uid] = ((snap.generation, snap.deleting), self._clock())
        log.info(
            "nudged %s (generation %d%s)",
            self.entity.workflow_id(snap.ref),
            snap.generation,
            ", deleting" if snap.deleting else "",
        )
