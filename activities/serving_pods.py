"""Kubernetes as the serving plane sees it: what a ModelDeployment's workflow needs to
read (its artifact's status, the nodes, where the artifact's claim is mounted, its
pods) and the few writes it makes (create
a serving pod, mark one draining, set the replica count through `/scale`).

Idempotent like every Kama activity: create→409 and delete→404 are success, a
draining mark is a label merge-patch. Reads return plain data so the workflow can
plan without I/O. API errors become the typed errors of `kube_errors`."""

from __future__ import annotations

from collections.abc import Collection
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube_clients import remove_pod
from activities.kube_errors import Conflict, KubeTarget, NotFound, kube_call
from activities.provenance import ForgedRequest, OwnerGone, kama_pod, live_object
from activities.tenant_fence import TenantFence
from kama.api import GROUP, VERSION
from kama.contracts import ARTIFACTS, DEPLOYMENTS, ObjectRef
from kama.deployment_plan import mounted_by_one_node, nodes_holding_claim
from kama.reasons import Failure
from kama.rollout import ObservedPod
from kama.serving_key import serving_key, with_serving_key
from kama.serving_pod import (
    DRAINING_LABEL,
    FINGERPRINT_LABEL,
    ORDINAL_ANNOTATION,
    SERVER_ROLE,
    ServingTemplate,
    serving_pod_manifest,
    serving_selector,
)
from kama.tenancy import TenancyPolicy

MAX_ADAPTERS = 8  # spec.adapters' maxItems: a forged request reads no more


@dataclass(frozen=True)
class InputsRequest:
    namespace: str
    artifact: str
    draft: str | None = None  # spec.runtime.draftModelRef
    adapters: list[str] = field(default_factory=list)  # spec.adapters' artifactRefs


@dataclass(frozen=True)
class DeploymentInputs:
    artifact_status: dict[str, Any] | None  # None: the artifact does not exist
    nodes: list[dict[str, Any]]
    # where pods mount the artifact's claim, when only one node at a time can
    claim_nodes: list[str] = field(default_factory=list)
    draft_status: dict[str, Any] | None = None  # None: no draft asked, or it does not exist
    # by artifact name; None: it does not exist
    adapter_statuses: dict[str, dict[str, Any] | None] = field(default_factory=dict)


@dataclass(frozen=True)
class PodsRequest:
    namespace: str
    deployment: str


@dataclass(frozen=True)
class CreatePod:
    """Replica `ordinal` of a ModelDeployment's serving template. The activity checks
    the deployment's uid against the live object, the template against the cluster
    and the operator's settings, and builds the Pod itself."""

    ref: ObjectRef  # the ModelDeployment
    template: ServingTemplate
    ordinal: int

    def manifest(self) -> dict[str, Any]:
        """The Pod this asks for (no I/O)."""
        return serving_pod_manifest(
            template=self.template,
            namespace=self.ref.namespace,
            deployment=self.ref.name,
            deployment_uid=self.ref.uid,
            ordinal=self.ordinal,
        )


@dataclass(frozen=True)
class PodName:
    namespace: str
    name: str
    force: bool = False  # no grace: its node is lost, no kubelet will confirm the deletion


@dataclass(frozen=True)
class ScaleRequest:
    ref: ObjectRef
    replicas: int


def _node_facts(node: dict[str, Any]) -> dict[str, Any]:
    """The parts of a Node the planner reads (keeps workflow histories small)."""
    meta, spec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
    return {
        "metadata": {"name": meta["name"], "labels": meta.get("labels") or {}},
        "spec": {k: spec[k] for k in ("taints", "unschedulable") if k in spec},
        "status": {"allocatable": status.get("allocatable") or {}},
    }


def lost_nodes(nodes: list[dict[str, Any]], *, pods: list[dict[str, Any]]) -> set[str]:
    """Nodes whose kubelet stopped answering (the node lifecycle controller set their
    Ready condition to Unknown, or tainted them unreachable), and the nodes `pods` are
    bound to that are gone."""
    known = {node["metadata"]["name"] for node in nodes}
    bound = {str(name) for pod in pods if (name := (pod.get("spec") or {}).get("nodeName"))}
    lost = bound - known
    for node in nodes:
        conditions = {
            c["type"]: c["status"] for c in (node.get("status") or {}).get("conditions") or []
        }
        taints = {t["key"] for t in (node.get("spec") or {}).get("taints") or []}
        if conditions.get("Ready") == "Unknown" or "node.kubernetes.io/unreachable" in taints:
            lost.add(node["metadata"]["name"])
    return lost


EXIT_MESSAGE_CHARS = 512  # of a container's termination message, in a pod's exit reason


def observed_pod(pod: dict[str, Any], *, lost: Collection[str] = ()) -> ObservedPod:
    """`lost`: the nodes whose pods count for nothing (see `lost_nodes`)."""
    meta, status = pod["metadata"], pod.get("status") or {}
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    scheduled = conditions.get("PodScheduled", {})
    exit_reason = None
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            said = str(terminated.get("message") or "").strip()[:EXIT_MESSAGE_CHARS]
            exit_reason = (
                f"{container['name']} exited {terminated.get('exitCode')}"
                f" ({terminated.get('reason') or 'Error'})" + (f": {said}" if said else "")
            )
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    return ObservedPod(
        name=meta["name"],
        fingerprint=labels.get(FINGERPRINT_LABEL, ""),
        ordinal=int(annotations.get(ORDINAL_ANNOTATION, "0") or 0),
        phase=status.get("phase") or "Pending",
        ready=conditions.get("Ready", {}).get("status") == "True",
        draining=labels.get(DRAINING_LABEL) == "true",
        deleting=meta.get("deletionTimestamp") is not None,
        unschedulable=scheduled.get("status") == "False"
        and scheduled.get("reason") == "Unschedulable",
        pod_ip=status.get("podIP"),
        node=(pod.get("spec") or {}).get("nodeName"),
        exit_reason=exit_reason,
        node_lost=(pod.get("spec") or {}).get("nodeName") in lost,
    )


def keyed_manifest(request: CreatePod, *, master_key: str | None) -> dict[str, Any]:
    """The Pod `request` asks for, its llama-server requiring the deployment's API key
    (`kama.serving_key`) when a master key is configured; the key goes into the
    runtime container's env only, so the fingerprint label stays the template's."""
    manifest = request.manifest()
    if master_key is None:
        return manifest
    key = serving_key(
        master=master_key, namespace=request.ref.namespace, deployment_uid=request.ref.uid
    )
    return with_serving_key(manifest, key=key)


class ServingPodActivities:
    def __init__(
        self,
        *,
        api: k8s.ApiClient,
        runtime_images: frozenset[str],
        tenancy: TenancyPolicy | None = None,
        serving_key: str | None = None,
        fence: TenantFence | None = None,
    ) -> None:
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.runtime_images = runtime_images
        self.tenancy = tenancy or TenancyPolicy()
        self.serving_key = serving_key  # the master key (kama.serving_key); None: no key
        self.fence = fence  # NetworkPolicies made before a namespace's first pod

    @activity.defn(name="Read artifact and nodes")
    def read_inputs(self, request: InputsRequest) -> DeploymentInputs:
        artifact_status = self._artifact_status(request.namespace, request.artifact)
        draft_status = (
            None
            if request.draft is None
            else self._artifact_status(request.namespace, request.draft)
        )
        with kube_call(verb="list", target=KubeTarget(resource="nodes")):
            listed = self.core.list_node().items
        nodes = self.api.sanitize_for_serialization(listed)
        return DeploymentInputs(
            artifact_status=artifact_status,
            nodes=[_node_facts(n) for n in nodes],
            claim_nodes=self._claim_nodes(request.namespace, artifact_status),
            draft_status=draft_status,
            adapter_statuses={
                name: self._artifact_status(request.namespace, name)
                for name in dict.fromkeys(request.adapters[:MAX_ADAPTERS])
            },
        )

    def _artifact_status(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The status of the ModelArtifact `name` in `namespace`; None if it does not exist."""
        target = KubeTarget(resource=ARTIFACTS, namespace=namespace, name=name)
        with suppress(NotFound), kube_call(verb="get", target=target):
            artifact = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, ARTIFACTS, name
            )
            return dict(artifact.get("status") or {})
        return None

    def _claim_nodes(self, namespace: str, artifact_status: dict[str, Any] | None) -> list[str]:
        """The nodes where pods mount the artifact's claim, if it is one that only one
        node at a time can mount (else nothing to read)."""
        location = (artifact_status or {}).get("servingLocation") or {}
        claim = location.get("claimName")
        if not claim or not mounted_by_one_node(location.get("accessModes") or []):
            return []
        with kube_call(verb="list", target=KubeTarget(resource="pods", namespace=namespace)):
            pods = self.core.list_namespaced_pod(namespace).items
        return nodes_holding_claim(pods=self.api.sanitize_for_serialization(pods), claim=claim)

    @activity.defn(name="List serving pods")
    def list_pods(self, request: PodsRequest) -> list[ObservedPod]:
        with kube_call(
            verb="list", target=KubeTarget(resource="pods", namespace=request.namespace)
        ):
            pods = self.core.list_namespaced_pod(
                request.namespace, label_selector=serving_selector(request.deployment)
            )
        raw = self.api.sanitize_for_serialization(pods.items)
        with kube_call(verb="list", target=KubeTarget(resource="nodes")):
            nodes = self.api.sanitize_for_serialization(self.core.list_node().items)
        lost = lost_nodes(nodes, pods=raw)
        return sorted((observed_pod(p, lost=lost) for p in raw), key=lambda p: p.name)

    @activity.defn(name="Create serving pod")
    def create_pod(self, request: CreatePod) -> None:
        ref, template = request.ref, request.template
        deployment = live_object(self.custom, policy=self.tenancy, plural=DEPLOYMENTS, ref=ref)
        self._check_template(ref=ref, deployment=deployment, template=template)
        manifest = keyed_manifest(request, master_key=self.serving_key)
        if self.fence is not None:
            self.fence.ensure(ref.namespace)
        target = KubeTarget(
            resource="pods", namespace=ref.namespace, name=manifest["metadata"]["name"]
        )
        with suppress(Conflict), kube_call(verb="create", target=target):
            self.core.create_namespaced_pod(ref.namespace, manifest)

    def _check_template(
        self, *, ref: ObjectRef, deployment: dict[str, Any], template: ServingTemplate
    ) -> None:
        """ForgedRequest unless the template runs a configured runtime image, mounts
        the claim and directory its artifact is served from, and asks only for nodes
        the operator lets tenants choose (PlacementNotAllowed otherwise)."""
        if template.image not in self.runtime_images:
            allowed = ", ".join(sorted(self.runtime_images))
            raise ForgedRequest(
                f"serving template image {template.image!r} is not a configured runtime "
                f"image ({allowed})"
            )
        refusals = self.tenancy.placement_refusals(
            node_selector=template.node_selector, tolerations=template.tolerations
        )
        if refusals:
            raise ApplicationError(
                "; ".join(refusals), type=Failure.PLACEMENT_NOT_ALLOWED, non_retryable=True
            )
        artifact = ((deployment.get("spec") or {}).get("modelRef") or {}).get("name")
        target = KubeTarget(resource=ARTIFACTS, namespace=ref.namespace, name=artifact)
        try:
            with kube_call(verb="get", target=target):
                found = self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, ref.namespace, ARTIFACTS, artifact
                )
        except NotFound:
            raise OwnerGone(f"there is no ModelArtifact {ref.namespace}/{artifact}") from None
        location = (found.get("status") or {}).get("servingLocation") or {}
        served = (location.get("claimName"), location.get("subPath", ""))
        if (template.claim_name, template.sub_path) != served:
            raise ForgedRequest(
                f"serving template mounts {template.claim_name}:{template.sub_path!r}; "
                f"ModelArtifact {ref.namespace}/{artifact} is served from "
                f"{served[0]}:{served[1]!r}"
            )

    def _serving_pod(self, pod: PodName) -> k8s.V1Pod | None:
        """The pod if it is a Kama serving pod (ForgedRequest if it is another), None
        when it is gone."""
        return kama_pod(
            self.core,
            policy=self.tenancy,
            namespace=pod.namespace,
            name=pod.name,
            role=SERVER_ROLE,
            owner_kind="ModelDeployment",
        )

    @activity.defn(name="Mark pod draining")
    def mark_draining(self, pod: PodName) -> str | None:
        """Label the pod so routers stop choosing it; its IP, or None when it is gone."""
        if self._serving_pod(pod) is None:
            return None
        target = KubeTarget(resource="pods", namespace=pod.namespace, name=pod.name)
        try:
            with kube_call(verb="patch", target=target):
                patched = self.core.patch_namespaced_pod(
                    pod.name, pod.namespace, {"metadata": {"labels": {DRAINING_LABEL: "true"}}}
                )
        except NotFound:
            return None
        ip: str | None = patched.status.pod_ip if patched.status else None
        return ip

    @activity.defn(name="Delete serving pod")
    def delete_pod(self, pod: PodName) -> None:
        if self._serving_pod(pod) is None:
            return
        remove_pod(self.core, namespace=pod.namespace, name=pod.name, force=pod.force)

    @activity.defn(name="Set deployment replicas")
    def set_replicas(self, request: ScaleRequest) -> None:
        """Write spec.replicas through the /scale subresource, as `kubectl scale` does
        (of the ModelDeployment with the ref's uid)."""
        try:
            live_object(self.custom, policy=self.tenancy, plural=DEPLOYMENTS, ref=request.ref)
        except OwnerGone:
            return
        target = KubeTarget(
            resource=f"{DEPLOYMENTS}/scale", namespace=request.ref.namespace, name=request.ref.name
        )
        with suppress(NotFound), kube_call(verb="patch", target=target):
            self.custom.patch_namespaced_custom_object_scale(
                GROUP,
                VERSION,
                request.ref.namespace,
                DEPLOYMENTS,
                request.ref.name,
                {"spec": {"replicas": request.replicas}},
                _content_type="application/merge-patch+json",
            )
