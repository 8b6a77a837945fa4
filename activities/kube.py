"""Kubernetes as an external system for Kama's workflows: status patches, Events,
finalizers, cache claims and importer pods. Every call is idempotent: create→409
and delete→404 are success, status writes are merge patches of what a workflow
decided. API errors become the typed errors of `kube_errors` (a 403 or a 422 is
not retried)."""

from __future__ import annotations

import datetime
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube_errors import Conflict, Invalid, KubeTarget, NotFound, kube_call
from kama.api import API_VERSION, FINALIZER, GROUP, VERSION
from kama.contracts import ARTIFACTS, CACHES, DEPLOYMENTS, ObjectRef

CACHE_MOUNT = "/cache"
SOURCE_MOUNT = "/source"
TOKEN_MOUNT = "/var/run/kama/hf-token"


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
class CacheRequest:
    namespace: str
    name: str


@dataclass(frozen=True)
class CacheClaim:
    claim_name: str
    access_modes: list[str]
    capacity: str = ""
    created_by_kama: bool = False


def cache_claim_name(cache: str) -> str:
    return f"kama-cache-{cache}"


@dataclass(frozen=True)
class ImporterPod:
    ref: ObjectRef  # the artifact that owns the pod
    operation_id: str
    task_queue: str
    cache_claim: str | None
    source_claim: str | None = None
    token_secret: str | None = None
    token_key: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str


@dataclass(frozen=True)
class ImporterSettings:
    image: str
    temporal_address: str
    temporal_namespace: str = "default"
    hf_endpoint: str = "https://huggingface.co"


def importer_pod_name(artifact: str, operation_id: str) -> str:
    return f"{artifact[:40]}-import-{operation_id[-12:]}".lower()


def remove_pod(core: k8s.CoreV1Api, *, namespace: str, name: str) -> None:
    """Delete a pod; one that is already gone is as good."""
    with (
        suppress(NotFound),
        kube_call(
            verb="delete", target=KubeTarget(resource="pods", namespace=namespace, name=name)
        ),
    ):
        core.delete_namespaced_pod(name, namespace)


class KubeActivities:
    def __init__(self, *, api: k8s.ApiClient, importer: ImporterSettings) -> None:
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.importer = importer

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
        now = datetime.datetime.now(datetime.UTC)
        event = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(
                name=f"{request.ref.name}.{uuid.uuid4().hex[:12]}", namespace=request.ref.namespace
            ),
            involved_object=k8s.V1ObjectReference(
                api_version=API_VERSION,
                kind=request.kind,
                name=request.ref.name,
                namespace=request.ref.namespace,
                uid=request.ref.uid,
            ),
            reason=request.reason,
            message=request.message[:1024],
            type=request.type,
            source=k8s.V1EventSource(component="kama"),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            reporting_component="kama.dev/controller",
            reporting_instance="kama-worker",
        )
        target = KubeTarget(resource="events", namespace=request.ref.namespace)
        with kube_call(verb="create", target=target):
            self.core.create_namespaced_event(request.ref.namespace, event)

    @activity.defn(name="Find cache claim")
    def cache_claim(self, request: CacheRequest) -> CacheClaim:
        target = KubeTarget(resource=CACHES, namespace=request.namespace, name=request.name)
        try:
            with kube_call(verb="get", target=target):
                cache = self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, request.namespace, CACHES, request.name
                )
        except NotFound:
            raise ApplicationError(
                f"ModelCache {request.namespace}/{request.name} does not exist",
                type="StorageUnavailable",
                non_retryable=True,
            ) from None
        spec = cache.get("spec", {})
        existing = spec.get("persistentVolumeClaim")
        if existing:
            name = existing["claimName"]
        else:
            template = spec.get("claimTemplate") or {}
            name = cache_claim_name(request.name)
            claim = k8s.V1PersistentVolumeClaim(
                metadata=k8s.V1ObjectMeta(
                    name=name,
                    namespace=request.namespace,
                    labels={"kama.dev/cache": request.name},
                    annotations={"kama.dev/created-by": "kama"},
                ),
                spec=k8s.V1PersistentVolumeClaimSpec(
                    access_modes=template.get("accessModes") or ["ReadWriteOnce"],
                    storage_class_name=template.get("storageClassName"),
                    resources=k8s.V1VolumeResourceRequirements(
                        requests={"storage": template.get("size", "10Gi")}
                    ),
                ),
            )
            target = KubeTarget(
                resource="persistentvolumeclaims", namespace=request.namespace, name=name
            )
            with suppress(Conflict), kube_call(verb="create", target=target):
                self.core.create_namespaced_persistent_volume_claim(request.namespace, claim)
        return self._bound_claim(
            namespace=request.namespace, name=name, owner=f"ModelCache {request.name}"
        )

    def _bound_claim(self, *, namespace: str, name: str, owner: str | None) -> CacheClaim:
        of = f" of {owner}" if owner else ""
        target = KubeTarget(resource="persistentvolumeclaims", namespace=namespace, name=name)
        try:
            with kube_call(verb="get", target=target):
                pvc = self.core.read_namespaced_persistent_volume_claim(name, namespace)
        except NotFound:
            raise ApplicationError(
                f"PersistentVolumeClaim {namespace}/{name}{of} does not exist",
                type="StorageUnavailable",
                non_retryable=True,
            ) from None
        if pvc.status.phase != "Bound":
            raise ApplicationError(
                f"claim {name}{of} is {pvc.status.phase}, not Bound yet", type="ClaimNotBound"
            )
        return CacheClaim(
            claim_name=name,
            access_modes=list(pvc.status.access_modes or pvc.spec.access_modes or []),
            capacity=str((pvc.status.capacity or {}).get("storage", "")),
            created_by_kama=(pvc.metadata.annotations or {}).get("kama.dev/created-by") == "kama",
        )

    @activity.defn(name="Find source claim")
    def source_claim(self, request: CacheRequest) -> CacheClaim:
        return self._bound_claim(namespace=request.namespace, name=request.name, owner=None)

    @activity.defn(name="Start importer pod")
    def ensure_importer_pod(self, request: ImporterPod) -> PodRef:
        name = importer_pod_name(request.ref.name, request.operation_id)
        volumes: list[dict[str, Any]] = []
        mounts: list[dict[str, Any]] = []
        if request.cache_claim:
            volumes.append(
                {"name": "cache", "persistentVolumeClaim": {"claimName": request.cache_claim}}
            )
            mounts.append({"name": "cache", "mountPath": CACHE_MOUNT})
        if request.source_claim:
            volumes.append(
                {
                    "name": "source",
                    "persistentVolumeClaim": {"claimName": request.source_claim, "readOnly": True},
                }
            )
            mounts.append({"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True})
        if request.token_secret and request.token_key:
            volumes.append(
                {
                    "name": "hf-token",
                    "secret": {
                        "secretName": request.token_secret,
                        "items": [{"key": request.token_key, "path": "token"}],
                        "defaultMode": 0o440,
                    },
                }
            )
            mounts.append({"name": "hf-token", "mountPath": TOKEN_MOUNT, "readOnly": True})
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": request.ref.namespace,
                "labels": {
                    "app.kubernetes.io/managed-by": "kama",
                    "kama.dev/role": "importer",
                    "kama.dev/artifact": request.ref.name,
                    "kama.dev/operation": request.operation_id,
                    **request.labels,
                },
                "ownerReferences": [
                    {
                        "apiVersion": API_VERSION,
                        "kind": "ModelArtifact",
                        "name": request.ref.name,
                        "uid": request.ref.uid,
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "restartPolicy": "Always",
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 10,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 65532,
                    "runAsGroup": 65532,
                    "fsGroup": 65532,
                },
                "containers": [
                    {
                        "name": "importer",
                        "image": self.importer.image,
                        "args": ["importer", "--task-queue", request.task_queue],
                        "env": [
                            {
                                "name": "KAMA_TEMPORAL_ADDRESS",
                                "value": self.importer.temporal_address,
                            },
                            {
                                "name": "KAMA_TEMPORAL_NAMESPACE",
                                "value": self.importer.temporal_namespace,
                            },
                            {"name": "KAMA_HF_ENDPOINT", "value": self.importer.hf_endpoint},
                        ],
                        "securityContext": {
                            "readOnlyRootFilesystem": True,
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": mounts,
                    }
                ],
                "volumes": volumes,
            },
        }
        target = KubeTarget(resource="pods", namespace=request.ref.namespace, name=name)
        with suppress(Conflict), kube_call(verb="create", target=target):
            self.core.create_namespaced_pod(request.ref.namespace, pod)
        return PodRef(namespace=request.ref.namespace, name=name)

    @activity.defn(name="Delete pod")
    def delete_pod(self, pod: PodRef) -> None:
        remove_pod(self.core, namespace=pod.namespace, name=pod.name)

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

    @activity.defn(name="Delete cache claim")
    def delete_cache_claim(self, request: CacheRequest) -> bool:
        """Delete the claim Kama created for a cache; never a claim Kama did not create."""
        name = cache_claim_name(request.name)
        target = KubeTarget(
            resource="persistentvolumeclaims", namespace=request.namespace, name=name
        )
        try:
            with kube_call(verb="get", target=target):
                pvc = self.core.read_namespaced_persistent_volume_claim(name, request.namespace)
        except NotFound:
            return False
        if (pvc.metadata.annotations or {}).get("kama.dev/created-by") != "kama":
            return False
        with suppress(NotFound), kube_call(verb="delete", target=target):
            self.core.delete_namespaced_persistent_volume_claim(name, request.namespace)
        return True

    @activity.defn(name="Release finalizer")
    def release_finalizer(self, request: FinalizerRequest) -> None:
        ref = request.ref
        target = KubeTarget(resource=request.plural, namespace=ref.namespace, name=ref.name)
        try:
            with kube_call(verb="get", target=target):
                obj = self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, ref.namespace, request.plural, ref.name
                )
        except NotFound:
            return
        if obj["metadata"]["uid"] != ref.uid:
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
                f"{exc.message}; reading it again", type="ObjectChanged"
            ) from exc
