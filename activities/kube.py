"""Kubernetes as an external system for Kama's workflows: status patches, Events,
finalizers, cache claims (and their expansion) and importer pods. Every call is idempotent: create→409
and delete→404 are success, status writes are merge patches of what a workflow
decided. API errors become the typed errors of `kube_errors` (a 403 or a 422 is
not retried)."""

from __future__ import annotations

import datetime
import secrets
import uuid
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client as k8s
from kubernetes.utils import parse_quantity
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube_errors import Conflict, Forbidden, Invalid, KubeTarget, NotFound, kube_call
from activities.provenance import ForgedRequest, kama_pod, live_object
from kama.api import API_VERSION, FINALIZER, GROUP, VERSION
from kama.contracts import ARTIFACTS, CACHES, DEPLOYMENTS, ObjectRef
from kama.importer_pod import (
    IMPORTER_ROLE,
    ImporterMounts,
    ImporterPodOptions,
    importer_pod_manifest,
    importer_pod_name,
)
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
class CacheRequest:
    namespace: str
    name: str


@dataclass(frozen=True)
class CacheClaim:
    claim_name: str
    access_modes: list[str]
    capacity: str = ""
    created_by_kama: bool = False
    # the bound volume's `spec.nodeAffinity` (core/v1 VolumeNodeAffinity, as JSON): the
    # nodes that can mount it (a local volume's node); None: any node
    node_affinity: dict[str, Any] | None = None
    owner_uid: str = ""  # the ModelCache's uid (its workflow's ID), for a cache's claim


def cache_claim_name(cache: str) -> str:
    return f"kama-cache-{cache}"


# what `Expand cache claim` found (ClaimExpansion.state)
CLAIM_SIZED = "Sized"  # the claim has the size the template asks for
TOKEN_BYTES = 32  # the importer pod's token: 256 random bits

CLAIM_EXPANDING = "Expanding"  # asked for more; the volume is not that large yet
CLAIM_NOT_EXPANDABLE = "ExpansionNotSupported"  # the template asks for more than it can get


@dataclass(frozen=True)
class ClaimExpansion:
    """Whether a cache's claim has the size its `claimTemplate.size` asks for, and if
    not, why (a resize under way, or one the claim cannot have)."""

    state: str
    message: str
    requested: str = ""
    capacity: str = ""


@dataclass(frozen=True)
class ImporterPod:
    """Which operation of which artifact the pod is for, and which of the artifact's
    own volumes it mounts: names only; the activity reads the rest from the cluster."""

    ref: ObjectRef  # the artifact that owns the pod (uid checked against the live one)
    operation_id: str
    mount_cache: bool = True
    mount_source: bool = False
    mount_token: bool = False


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str


@dataclass(frozen=True)
class ImporterSettings:
    image: str
    hf_endpoint: str = "https://huggingface.co"
    options: ImporterPodOptions = field(default_factory=ImporterPodOptions)

    def pod_manifest(
        self, *, name: str, owner: ObjectRef, operation_id: str, mounts: ImporterMounts
    ) -> dict[str, Any]:
        """The importer pod of one operation with these settings (no I/O)."""
        return importer_pod_manifest(
            name=name,
            owner=owner,
            operation_id=operation_id,
            image=self.image,
            token=secrets.token_urlsafe(TOKEN_BYTES),
            hf_endpoint=self.hf_endpoint,
            mounts=mounts,
            extra_volumes=[extra for extra in (self.options.ca_volume(),) if extra is not None],
            options=self.options,
        )


def remove_pod(core: k8s.CoreV1Api, *, namespace: str, name: str, force: bool = False) -> None:
    """Delete a pod; one that is already gone is as good. `force`: at once, without the
    grace period (the pod's kubelet is lost and would never confirm it)."""
    with (
        suppress(NotFound),
        kube_call(
            verb="delete", target=KubeTarget(resource="pods", namespace=namespace, name=name)
        ),
    ):
        if force:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        else:
            core.delete_namespaced_pod(name, namespace)


class KubeActivities:
    def __init__(
        self,
        *,
        api: k8s.ApiClient,
        importer: ImporterSettings,
        tenancy: TenancyPolicy | None = None,
    ) -> None:
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.importer = importer
        self.tenancy = tenancy or TenancyPolicy()

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
        found = self._bound_claim(
            namespace=request.namespace, name=name, owner=f"ModelCache {request.name}"
        )
        return replace(found, owner_uid=str(cache.get("metadata", {}).get("uid", "")))

    @activity.defn(name="Expand cache claim")
    def expand_cache_claim(self, request: CacheRequest) -> ClaimExpansion:
        """Grow the claim Kama created for a cache to `spec.claimTemplate.size` (a claim
        never shrinks, and one Kama did not create is never touched), when its
        StorageClass allows expansion; otherwise say why it cannot grow."""
        target = KubeTarget(resource=CACHES, namespace=request.namespace, name=request.name)
        with kube_call(verb="get", target=target):
            cache = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, request.namespace, CACHES, request.name
            )
        wanted = (cache.get("spec", {}).get("claimTemplate") or {}).get("size")
        name = cache_claim_name(request.name)
        claim_target = KubeTarget(
            resource="persistentvolumeclaims", namespace=request.namespace, name=name
        )
        with kube_call(verb="get", target=claim_target):
            pvc = self.core.read_namespaced_persistent_volume_claim(name, request.namespace)
        requested = str((pvc.spec.resources.requests or {}).get("storage", ""))
        capacity = str(((pvc.status and pvc.status.capacity) or {}).get("storage", ""))
        sizes = {"requested": requested, "capacity": capacity}
        if not wanted or (pvc.metadata.annotations or {}).get("kama.dev/created-by") != "kama":
            return ClaimExpansion(state=CLAIM_SIZED, message="not Kama's claim to size", **sizes)
        if parse_quantity(wanted) > parse_quantity(requested or "0"):
            refused = self._expansion_refused(pvc.spec.storage_class_name)
            if refused is None:
                refused = self._request_size(claim_target, size=wanted)
            if refused is not None:
                return ClaimExpansion(
                    state=CLAIM_NOT_EXPANDABLE,
                    message=f"spec.claimTemplate.size is {wanted} but claim {name} has "
                    f"{capacity or requested} and cannot grow: {refused}",
                    **sizes,
                )
            sizes["requested"] = requested = wanted
        if capacity and parse_quantity(capacity) >= parse_quantity(requested):
            return ClaimExpansion(
                state=CLAIM_SIZED, message=f"claim {name} has {capacity}", **sizes
            )
        pending = "; ".join(
            f"{c.type}: {c.message or c.reason or c.status}"
            for c in (pvc.status.conditions if pvc.status else None) or []
        )
        return ClaimExpansion(
            state=CLAIM_EXPANDING,
            message=f"claim {name} is being expanded from {capacity or '?'} to {requested}"
            + (f" ({pending})" if pending else ""),
            **sizes,
        )

    def _expansion_refused(self, storage_class: str | None) -> str | None:
        """Why a claim of `storage_class` cannot be expanded, or None."""
        if not storage_class:
            return "the claim has no StorageClass"
        try:
            found = self._storage_class(storage_class)
        except NotFound:
            return f"StorageClass {storage_class} does not exist"
        except Forbidden as exc:
            return f"Kama may not read its StorageClass ({exc.message})"
        if not found.allow_volume_expansion:
            return f"StorageClass {storage_class} does not allow volume expansion (allowVolumeExpansion is not true)"
        return None

    def _request_size(self, target: KubeTarget, *, size: str) -> str | None:
        """Patch the claim's requested storage; why the API server refused, or None."""
        assert target.namespace is not None and target.name is not None
        patch = {"spec": {"resources": {"requests": {"storage": size}}}}
        try:
            with kube_call(verb="patch", target=target):
                self.core.patch_namespaced_persistent_volume_claim(
                    target.name,
                    target.namespace,
                    patch,
                    _content_type="application/merge-patch+json",
                )
        except (Forbidden, Invalid) as exc:
            return exc.message
        return None

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
        if pvc.status.phase != "Bound" and not self._binds_with_first_pod(pvc):
            raise ApplicationError(
                f"claim {name}{of} is {pvc.status.phase}, not Bound yet", type="ClaimNotBound"
            )
        return CacheClaim(
            claim_name=name,
            access_modes=list(pvc.status.access_modes or pvc.spec.access_modes or []),
            capacity=str((pvc.status.capacity or {}).get("storage", "")),
            created_by_kama=(pvc.metadata.annotations or {}).get("kama.dev/created-by") == "kama",
            node_affinity=self._volume_node_affinity(pvc.spec.volume_name),
        )

    def _binds_with_first_pod(self, pvc: Any) -> bool:
        """Whether a Pending claim waits for its first pod: its StorageClass binds
        `WaitForFirstConsumer` (the default on many clouds), so the importer or serving
        pod that mounts it is what binds it, and waiting for Bound first never ends."""
        if pvc.status.phase != "Pending" or not pvc.spec.storage_class_name:
            return False
        try:
            found = self._storage_class(pvc.spec.storage_class_name)
        except (NotFound, Forbidden):
            return False
        return bool(found.volume_binding_mode == "WaitForFirstConsumer")

    def _storage_class(self, name: str) -> Any:
        """The StorageClass `name`; raises the typed KubeError (NotFound, Forbidden, …)."""
        with kube_call(verb="get", target=KubeTarget(resource="storageclasses", name=name)):
            return k8s.StorageV1Api(self.core.api_client).read_storage_class(name)

    def _volume_node_affinity(self, volume: str | None) -> dict[str, Any] | None:
        """The bound PersistentVolume's `spec.nodeAffinity` as JSON (a local volume
        names its node). Without `get` on persistentvolumes (a cluster-scoped read) it
        is unknown, and placement then assumes every node can mount the claim."""
        if not volume:
            return None
        target = KubeTarget(resource="persistentvolumes", name=volume)
        try:
            with kube_call(verb="get", target=target):
                pv = self.core.read_persistent_volume(volume)
        except (NotFound, Forbidden) as exc:
            activity.logger.warning("node affinity of %s unknown: %s", volume, exc.message)
            return None
        affinity = pv.spec.node_affinity if pv.spec else None
        found: dict[str, Any] | None = self.api.sanitize_for_serialization(affinity)
        return found or None

    @activity.defn(name="Find source claim")
    def source_claim(self, request: CacheRequest) -> CacheClaim:
        return self._bound_claim(namespace=request.namespace, name=request.name, owner=None)

    @activity.defn(name="Start importer pod")
    def ensure_importer_pod(self, request: ImporterPod) -> PodRef:
        """The importer pod of one operation, built from the live ModelArtifact (its
        uid checked): the claims and the token Secret it mounts are the ones the
        artifact's spec names, in the artifact's own namespace."""
        ref = request.ref
        artifact = live_object(self.custom, policy=self.tenancy, plural=ARTIFACTS, ref=ref)
        name = importer_pod_name(ref.name, request.operation_id)
        pod = self.importer.pod_manifest(
            name=name,
            owner=ref,
            operation_id=request.operation_id,
            mounts=self._importer_mounts(artifact, request),
        )
        target = KubeTarget(resource="pods", namespace=ref.namespace, name=name)
        with suppress(Conflict), kube_call(verb="create", target=target):
            self.core.create_namespaced_pod(ref.namespace, pod)
        return PodRef(namespace=ref.namespace, name=name)

    def _importer_mounts(self, artifact: dict[str, Any], request: ImporterPod) -> ImporterMounts:
        """The claims and Secret the artifact's spec names, those the operation uses."""
        spec = artifact.get("spec") or {}
        source = spec.get("source") or {}
        pvc = source.get("persistentVolumeClaim") or {}
        token = (source.get("huggingFace") or {}).get("tokenSecretRef") or {}
        cache_claim = None
        if request.mount_cache:
            cache = (spec.get("cacheRef") or {}).get("name")
            if not cache:
                raise ForgedRequest(
                    f"ModelArtifact {request.ref.namespace}/{request.ref.name} names no cache"
                )
            cache_claim = self._cache_claim_of(namespace=request.ref.namespace, cache=cache)
        return ImporterMounts(
            cache_claim=cache_claim,
            source_claim=pvc.get("claimName") if request.mount_source else None,
            token_secret=token.get("name") if request.mount_token else None,
            token_key=token.get("key") if request.mount_token else None,
        )

    def _cache_claim_of(self, *, namespace: str, cache: str) -> str:
        """The claim of ModelCache `cache`: its existing claim or the one Kama made."""
        target = KubeTarget(resource=CACHES, namespace=namespace, name=cache)
        with kube_call(verb="get", target=target):
            found = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, CACHES, cache
            )
        existing = (found.get("spec") or {}).get("persistentVolumeClaim") or {}
        return str(existing.get("claimName") or cache_claim_name(cache))

    @activity.defn(name="Delete pod")
    def delete_pod(self, pod: PodRef) -> None:
        """Delete an importer pod; ForgedRequest for any other pod."""
        found = kama_pod(
            self.core,
            policy=self.tenancy,
            namespace=pod.namespace,
            name=pod.name,
            role=IMPORTER_ROLE,
            owner_kind="ModelArtifact",
        )
        if found is not None:
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
