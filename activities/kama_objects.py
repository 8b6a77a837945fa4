"""Kama's own resources (ModelArtifact, ModelCache, ModelDeployment) as the workflows
write them: status merge patches, Events about them, the release of Kama's finalizer,
which of them still use an artifact or a cache, and each one as the API server has it
now (what an entity workflow acts on: the snapshot a `spec changed` signal carries is
only a hint, since anyone with a Temporal client can send one). Every call is idempotent: an
object already gone is as good as written, and the finalizer is released only from
the object with the workflow's uid, as it was read (a JSON patch that tests the
resourceVersion)."""

from __future__ import annotations

import datetime
import uuid
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube_clients import KubeClients
from activities.kube_errors import Invalid, KubeTarget, NotFound, kube_call
from activities.provenance import check_served
from kama.api import FINALIZER, GROUP, VERSION
from kama.contracts import ARTIFACTS, DEPLOYMENTS, LiveObject, ObjectRef
from kama.kube_events import event_manifest
from kama.reasons import Failure
from kama.tenancy import TenancyPolicy


@dataclass(frozen=True)
class StatusPatch:
    kind_plural: str
    ref: ObjectRef
    status: dict[str, Any]


@dataclass(frozen=True)
class EventRequest:
    kind: str
    ref: ObjectRef
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class FinalizerRequest:
    plural: str
    ref: ObjectRef


@dataclass(frozen=True)
class ObjectRead:
    plural: str
    ref: ObjectRef


class KamaObjectActivities(KubeClients):
    tenancy: TenancyPolicy = TenancyPolicy()  # set by the class that holds the settings

    def _object(self, *, plural: str, ref: ObjectRef) -> dict[str, Any] | None:
        """The object `ref` names with `ref.uid`, read now; None when there is none."""
        target = KubeTarget(resource=plural, namespace=ref.namespace, name=ref.name)
        try:
            with kube_call(verb="get", target=target):
                found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, ref.namespace, plural, ref.name
                )
        except NotFound:
            return None
        return found if (found.get("metadata") or {}).get("uid") == ref.uid else None

    @activity.defn(name="Read Kama object")
    def read_object(self, request: ObjectRead) -> LiveObject:
        """The object `request.ref` names, as the API server has it now: its
        generation, spec and whether it is being deleted, or `gone` when no object
        with that name has that uid any more."""
        check_served(self.tenancy, request.ref.namespace)
        found = self._object(plural=request.plural, ref=request.ref)
        if found is None:
            return LiveObject(gone=True)
        metadata = found["metadata"]
        return LiveObject(
            generation=int(metadata.get("generation") or 0),
            spec=found.get("spec") or {},
            deleting=metadata.get("deletionTimestamp") is not None,
        )

    @activity.defn(name="Write status")
    def patch_status(self, patch: StatusPatch) -> None:
        target = KubeTarget(
            resource=f"{patch.kind_plural}/status",
            namespace=patch.ref.namespace,
            name=patch.ref.name,
        )
        with suppress(NotFound), kube_call(verb="patch", target=target):
            self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                patch.ref.namespace,
                patch.kind_plural,
                patch.ref.name,
                {"status": patch.status},
                _content_type="application/merge-patch+json",
            )

    @activity.defn(name="Record event")
    def record_event(self, request: EventRequest) -> None:
        event = event_manifest(
            kind=request.kind,
            namespace=request.ref.namespace,
            name=request.ref.name,
            uid=request.ref.uid,
            type=request.type,
            reason=request.reason,
            message=request.message,
            now=datetime.datetime.now(datetime.UTC),
            suffix=uuid.uuid4().hex[:12],
            instance="kama-worker",
        )
        target = KubeTarget(resource="events", namespace=request.ref.namespace)
        with kube_call(verb="create", target=target):
            self.core.create_namespaced_event(request.ref.namespace, event)

    @activity.defn(name="List deployments using artifact")
    def artifact_users(self, ref: ObjectRef) -> list[str]:
        try:
            with kube_call(
                verb="list", target=KubeTarget(resource=DEPLOYMENTS, namespace=ref.namespace)
            ):
                items = self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, ref.namespace, DEPLOYMENTS
                )["items"]
        except NotFound:  # ModelDeployment not installed: nothing can reference the artifact
            return []
        return sorted(
            i["metadata"]["name"]
            for i in items
            if i.get("spec", {}).get("modelRef", {}).get("name") == ref.name
        )

    @activity.defn(name="List artifacts using cache")
    def cache_users(self, ref: ObjectRef) -> list[str]:
        with kube_call(verb="list", target=KubeTarget(resource=ARTIFACTS, namespace=ref.namespace)):
            items = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, ref.namespace, ARTIFACTS
            )["items"]
        return sorted(
            i["metadata"]["name"]
            for i in items
            if (i.get("spec", {}).get("cacheRef") or {}).get("name") == ref.name
        )

    @activity.defn(name="Release finalizer")
    def release_finalizer(self, request: FinalizerRequest) -> None:
        ref = request.ref
        target = KubeTarget(resource=request.plural, namespace=ref.namespace, name=ref.name)
        obj = self._object(plural=request.plural, ref=ref)
        if obj is None:
            return
        finalizers = obj["metadata"].get("finalizers") or []
        if FINALIZER not in finalizers:
            return
        patch = [
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": obj["metadata"]["resourceVersion"],
            },
            {
                "op": "replace",
                "path": "/metadata/finalizers",
                "value": [f for f in finalizers if f != FINALIZER],
            },
        ]
        try:  # a list body is sent as a JSON patch
            with suppress(NotFound), kube_call(verb="patch", target=target):
                self.custom.patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    ref.namespace,
                    request.plural,
                    ref.name,
                    patch,
                    _content_type="application/json-patch+json",
                )
        except Invalid as exc:  # the `test` failed: the object changed since it was read
            raise ApplicationError(
                f"{exc.message}; reading it again", type=Failure.OBJECT_CHANGED
            ) from exc
