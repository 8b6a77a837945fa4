"""Importer pods as the workflows start and delete them: read what the pod may mount
from the live ModelArtifact (its uid checked), build the pod as data
(`kama.importer_pod`), create it. The activity's input only names the artifact and
the operation; the claims and the token Secret come from the artifact's own spec, in
its own namespace. Creating a pod that exists and deleting one that is gone are
success; any other pod than Kama's importer of an artifact is `ForgedRequest`."""

from __future__ import annotations

import secrets
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from temporalio import activity

from activities.claims import cache_claim_of
from activities.kube_clients import KubeClients, remove_pod
from activities.kube_errors import Conflict, KubeTarget, kube_call
from activities.provenance import ForgedRequest, kama_pod, live_object
from activities.tenant_fence import TenantFence
from kama.contracts import ARTIFACTS, ObjectRef
from kama.importer_pod import (
    IMPORTER_ROLE,
    ImporterMounts,
    ImporterTemplate,
    artifact_mounts,
    importer_pod_manifest,
    importer_pod_name,
)
from kama.importer_protocol import importer_token
from kama.tenancy import TenancyPolicy

TOKEN_BYTES = 32  # the importer pod's token: 256 random bits


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


class ImporterPodActivities(KubeClients):
    def __init__(
        self,
        *,
        api: k8s.ApiClient,
        importer: ImporterTemplate,
        tenancy: TenancyPolicy | None = None,
        master_key: str | None = None,
        fence: TenantFence | None = None,
    ) -> None:
        super().__init__(api=api)
        self.importer = importer
        self.tenancy = tenancy or TenancyPolicy()
        self.master_key = master_key  # KAMA_SERVING_KEY: importer tokens are derived
        self.fence = fence  # NetworkPolicies made before a namespace's first pod

    @activity.defn(name="Start importer pod")
    def ensure_importer_pod(self, request: ImporterPod) -> PodRef:
        """The importer pod of one operation, built from the live ModelArtifact (its
        uid checked): the claims and the token Secret it mounts are the ones the
        artifact's spec names, in the artifact's own namespace."""
        ref = request.ref
        artifact = live_object(self.custom, policy=self.tenancy, plural=ARTIFACTS, ref=ref)
        name = importer_pod_name(ref.name, request.operation_id)
        pod = importer_pod_manifest(
            template=self.importer,
            name=name,
            owner=ref,
            operation_id=request.operation_id,
            token=self._token(ref, operation=request.operation_id, pod=name),
            mounts=self._mounts(artifact.get("spec") or {}, request),
        )
        if self.fence is not None:
            self.fence.ensure(ref.namespace)
        target = KubeTarget(resource="pods", namespace=ref.namespace, name=name)
        with suppress(Conflict), kube_call(verb="create", target=target):
            self.core.create_namespaced_pod(ref.namespace, pod)
        return PodRef(namespace=ref.namespace, name=name)

    def _token(self, ref: ObjectRef, *, operation: str, pod: str) -> str:
        """The pod's token: derived where there is a master key (the relays then bind
        only pods whose token they can derive), else random."""
        if self.master_key is None:
            return secrets.token_urlsafe(TOKEN_BYTES)
        return importer_token(
            master=self.master_key,
            namespace=ref.namespace,
            artifact_uid=ref.uid,
            operation=operation,
            pod=pod,
        )

    def _mounts(self, spec: dict[str, Any], request: ImporterPod) -> ImporterMounts:
        """The claims and Secret the artifact's spec names, those the operation uses."""
        cache_claim = None
        if request.mount_cache:
            cache = (spec.get("cacheRef") or {}).get("name")
            if not cache:
                raise ForgedRequest(
                    f"ModelArtifact {request.ref.namespace}/{request.ref.name} names no cache"
                )
            cache_claim = cache_claim_of(self.custom, namespace=request.ref.namespace, cache=cache)
        return artifact_mounts(
            spec,
            cache_claim=cache_claim,
            source=request.mount_source,
            token=request.mount_token,
        )

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
