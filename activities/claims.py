"""The PersistentVolumeClaims an artifact's bytes live on: a ModelCache's claim (the one
its spec names, or the one Kama creates from its `claimTemplate`, grows to the
template's size and deletes with the cache) and an artifact's source claim. Kama
never resizes or deletes a claim it did not create (the `kama.dev/created-by`
annotation says which it did). A claim is found once it is Bound, or Pending on a
StorageClass that binds with its first pod; a missing cache or claim is
`StorageUnavailable` (non-retryable), one not bound yet `ClaimNotBound` (retried)."""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any

from kubernetes import client as k8s
from kubernetes.utils import parse_quantity
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube_clients import KubeClients
from activities.kube_errors import Conflict, Forbidden, Invalid, KubeTarget, NotFound, kube_call
from kama.api import GROUP, VERSION
from kama.contracts import CACHES
from kama.reasons import Failure

CREATED_BY = "kama.dev/created-by"  # annotation on the claims Kama creates, value "kama"
DEFAULT_ACCESS_MODES = ["ReadWriteOnce"]
DEFAULT_SIZE = "10Gi"

# what `Expand cache claim` found (ClaimExpansion.state)
CLAIM_SIZED = "Sized"  # the claim has the size the template asks for
CLAIM_EXPANDING = "Expanding"  # asked for more; the volume is not that large yet
CLAIM_NOT_EXPANDABLE = "ExpansionNotSupported"  # the template asks for more than it can get


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


@dataclass(frozen=True)
class ClaimExpansion:
    """Whether a cache's claim has the size its `claimTemplate.size` asks for, and if
    not, why (a resize under way, or one the claim cannot have)."""

    state: str
    message: str
    requested: str = ""
    capacity: str = ""


def cache_claim_name(cache: str) -> str:
    """The claim Kama creates for ModelCache `cache` from its `claimTemplate`."""
    return f"kama-cache-{cache}"


def cache_claim_of(custom: k8s.CustomObjectsApi, *, namespace: str, cache: str) -> str:
    """The claim of ModelCache `cache`: its existing claim or the one Kama made."""
    target = KubeTarget(resource=CACHES, namespace=namespace, name=cache)
    with kube_call(verb="get", target=target):
        found = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, CACHES, cache)
    existing = (found.get("spec") or {}).get("persistentVolumeClaim") or {}
    return str(existing.get("claimName") or cache_claim_name(cache))


def _created_by_kama(pvc: Any) -> bool:
    return bool((pvc.metadata.annotations or {}).get(CREATED_BY) == "kama")


def _claim_target(*, namespace: str, name: str) -> KubeTarget:
    return KubeTarget(resource="persistentvolumeclaims", namespace=namespace, name=name)


class ClaimActivities(KubeClients):
    def _live_cache(self, request: CacheRequest) -> dict[str, Any] | None:
        """The ModelCache the request names, read now; None when it does not exist."""
        target = KubeTarget(resource=CACHES, namespace=request.namespace, name=request.name)
        try:
            with kube_call(verb="get", target=target):
                found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, request.namespace, CACHES, request.name
                )
        except NotFound:
            return None
        return found

    @activity.defn(name="Find cache claim")
    def cache_claim(self, request: CacheRequest) -> CacheClaim:
        cache = self._live_cache(request)
        if cache is None:
            raise ApplicationError(
                f"ModelCache {request.namespace}/{request.name} does not exist",
                type=Failure.STORAGE_UNAVAILABLE,
                non_retryable=True,
            )
        spec = cache.get("spec", {})
        existing = spec.get("persistentVolumeClaim")
        if existing:
            name = existing["claimName"]
        else:
            name = cache_claim_name(request.name)
            self._create_claim(
                namespace=request.namespace,
                name=name,
                cache=request.name,
                template=spec.get("claimTemplate") or {},
            )
        found = self._bound_claim(
            namespace=request.namespace, name=name, owner=f"ModelCache {request.name}"
        )
        return replace(found, owner_uid=str(cache.get("metadata", {}).get("uid", "")))

    def _create_claim(
        self, *, namespace: str, name: str, cache: str, template: dict[str, Any]
    ) -> None:
        """Create the claim a cache's `claimTemplate` describes; one that exists is kept."""
        claim = k8s.V1PersistentVolumeClaim(
            metadata=k8s.V1ObjectMeta(
                name=name,
                namespace=namespace,
                labels={"kama.dev/cache": cache},
                annotations={CREATED_BY: "kama"},
            ),
            spec=k8s.V1PersistentVolumeClaimSpec(
                access_modes=template.get("accessModes") or DEFAULT_ACCESS_MODES,
                storage_class_name=template.get("storageClassName"),
                resources=k8s.V1VolumeResourceRequirements(
                    requests={"storage": template.get("size", DEFAULT_SIZE)}
                ),
            ),
        )
        target = _claim_target(namespace=namespace, name=name)
        with suppress(Conflict), kube_call(verb="create", target=target):
            self.core.create_namespaced_persistent_volume_claim(namespace, claim)

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
        claim_target = _claim_target(namespace=request.namespace, name=name)
        with kube_call(verb="get", target=claim_target):
            pvc = self.core.read_namespaced_persistent_volume_claim(name, request.namespace)
        requested = str((pvc.spec.resources.requests or {}).get("storage", ""))
        capacity = str(((pvc.status and pvc.status.capacity) or {}).get("storage", ""))
        sizes = {"requested": requested, "capacity": capacity}
        if not wanted or not _created_by_kama(pvc):
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
        target = _claim_target(namespace=namespace, name=name)
        try:
            with kube_call(verb="get", target=target):
                pvc = self.core.read_namespaced_persistent_volume_claim(name, namespace)
        except NotFound:
            raise ApplicationError(
                f"PersistentVolumeClaim {namespace}/{name}{of} does not exist",
                type=Failure.STORAGE_UNAVAILABLE,
                non_retryable=True,
            ) from None
        if pvc.status.phase != "Bound" and not self._binds_with_first_pod(pvc):
            raise ApplicationError(
                f"claim {name}{of} is {pvc.status.phase}, not Bound yet",
                type=Failure.CLAIM_NOT_BOUND,
            )
        return CacheClaim(
            claim_name=name,
            access_modes=list(pvc.status.access_modes or pvc.spec.access_modes or []),
            capacity=str((pvc.status.capacity or {}).get("storage", "")),
            created_by_kama=_created_by_kama(pvc),
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
            return k8s.StorageV1Api(self.api).read_storage_class(name)

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

    @activity.defn(name="Delete cache claim")
    def delete_cache_claim(self, request: CacheRequest) -> bool:
        """Delete the claim Kama created for a cache; never a claim Kama did not create,
        and only while the live ModelCache is being deleted with `retentionPolicy:
        Delete` (whoever reaches Kama's Temporal namespace can schedule this: the request
        only names the cache)."""
        cache = self._live_cache(request)
        if cache is None:
            return False  # its workflow deletes the claim before it lets the cache go
        spec = cache.get("spec") or {}
        if (
            (cache.get("metadata") or {}).get("deletionTimestamp") is None
            or spec.get("retentionPolicy") != "Delete"
            or "claimTemplate" not in spec
        ):
            return False
        name = cache_claim_name(request.name)
        target = _claim_target(namespace=request.namespace, name=name)
        try:
            with kube_call(verb="get", target=target):
                pvc = self.core.read_namespaced_persistent_volume_claim(name, request.namespace)
        except NotFound:
            return False
        if not _created_by_kama(pvc):
            return False
        with suppress(NotFound), kube_call(verb="delete", target=target):
            self.core.delete_namespaced_persistent_volume_claim(name, request.namespace)
        return True
