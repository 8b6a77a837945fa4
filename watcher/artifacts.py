"""ModelArtifact events → the artifact's entity workflow.

On first sight the watcher adds Kama's finalizer (so deletion waits for the
workflow), then signal-with-starts `artifact/<ns>/<name>/<uid>` with the latest
spec. Workflow IDs are deterministic and the signal is an idempotent nudge, so any
number of watchers may run at once.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from activities.kube import ARTIFACTS, ObjectRef
from kama.api import FINALIZER, GROUP, VERSION
from workflows.artifact import ArtifactInput, ArtifactSnapshot, ArtifactWorkflow

log = logging.getLogger("kama.watcher")

KAMA_KIND = SearchAttributeKey.for_keyword("KamaKind")
KAMA_NAMESPACE = SearchAttributeKey.for_keyword("KamaNamespace")
KAMA_NAME = SearchAttributeKey.for_keyword("KamaName")


def artifact_workflow_id(ref: ObjectRef) -> str:
    return f"artifact/{ref.namespace}/{ref.name}/{ref.uid}"


def snapshot_of(obj: dict[str, Any]) -> ArtifactSnapshot:
    meta = obj["metadata"]
    return ArtifactSnapshot(
        ref=ObjectRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]),
        generation=int(meta.get("generation", 1)),
        spec=obj.get("spec", {}),
        deleting=meta.get("deletionTimestamp") is not None,
    )


def spec_summary(spec: dict[str, Any]) -> str:
    source = spec.get("source", {})
    if "huggingFace" in source:
        hf = source["huggingFace"]
        return f"huggingFace {hf.get('repo')}@{hf.get('revision', 'main')} {','.join(hf.get('files', []))}"
    pvc = source.get("persistentVolumeClaim", {})
    return f"pvc {pvc.get('claimName')}:{pvc.get('path')} ({pvc.get('mode', 'Copy')})"


class ArtifactNudger:
    def __init__(self, *, client: Client, custom: k8s.CustomObjectsApi, task_queue: str) -> None:
        self.client = client
        self.custom = custom
        self.task_queue = task_queue

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
                ARTIFACTS,
                meta["name"],
                patch,
                _content_type="application/json-patch+json",
            )
        except k8s.ApiException as exc:
            if exc.status in (404, 422):  # gone, or replaced by a new object: its own event follows
                return False
            raise
        return True

    async def nudge(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "DELETED":
            return  # the finalizer guarantees the workflow saw the deletion first
        if not self.ensure_finalizer(obj):
            return
        snap = snapshot_of(obj)
        await self.client.start_workflow(
            ArtifactWorkflow.run,
            ArtifactInput(snapshot=snap),
            id=artifact_workflow_id(snap.ref),
            task_queue=self.task_queue,
            start_signal="spec changed",
            start_signal_args=[snap],
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(KAMA_KIND, "ModelArtifact"),
                    SearchAttributePair(KAMA_NAMESPACE, snap.ref.namespace),
                    SearchAttributePair(KAMA_NAME, snap.ref.name),
                ]
            ),
            memo={"spec": spec_summary(snap.spec)},
        )
        log.info(
            "nudged %s (generation %d%s)",
            artifact_workflow_id(snap.ref),
            snap.generation,
            ", deleting" if snap.deleting else "",
        )
