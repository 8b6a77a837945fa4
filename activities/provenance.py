"""What an activity acts on comes from the cluster, never from its input alone.

Anyone who reaches Kama's Temporal namespace can schedule Kama's activities with an
input of their choosing, and the worker runs them with its own Kubernetes rights.
So an activity's input only *names* things (a ModelDeployment and its uid, a pod, an
operation); before acting, the activity reads what those names refer to in the
cluster and checks that it is Kama's own in a namespace Kama serves. A mismatch ends
the activity at once with `ForgedRequest`, non-retryable, naming what did not match:
retrying a forged task can only fail again, and a person should see it.

The checks here are the ones several activities share; each activity adds what is
particular to it (the runtime image, the artifact's claim)."""

from __future__ import annotations

from typing import Any, Final

from kubernetes import client as k8s
from temporalio.exceptions import ApplicationError

from activities.kube_errors import KubeTarget, NotFound, kube_call
from kama.api import GROUP, VERSION
from kama.contracts import ObjectRef
from kama.reasons import Failure
from kama.serving_pod import MANAGED_BY_LABEL, ROLE_LABEL
from kama.tenancy import TenancyPolicy

KINDS: Final = {
    "modeldeployments": "ModelDeployment",
    "modelartifacts": "ModelArtifact",
    "modelcaches": "ModelCache",
}


class ForgedRequest(ApplicationError):
    """The activity's input does not match the cluster: it was not scheduled by one of
    Kama's workflows for an object that exists as named. Never retried."""

    def __init__(self, message: str) -> None:
        super().__init__(message, type=Failure.FORGED_REQUEST, non_retryable=True)


class OwnerGone(ApplicationError):
    """The object the activity acts for no longer exists (deleted meanwhile): nothing
    is created for it. Never retried."""

    def __init__(self, message: str) -> None:
        super().__init__(message, type=Failure.OWNER_GONE, non_retryable=True)


def check_served(policy: TenancyPolicy, namespace: str) -> None:
    if not policy.serves(namespace):
        raise ForgedRequest(f"namespace {namespace!r} is not one that Kama serves")


def live_object(
    custom: k8s.CustomObjectsApi, *, policy: TenancyPolicy, plural: str, ref: ObjectRef
) -> dict[str, Any]:
    """The Kama resource `ref` names, read now; ForgedRequest unless it is in a served
    namespace with exactly `ref.uid`, OwnerGone when it does not exist."""
    kind = KINDS.get(plural, plural)
    check_served(policy, ref.namespace)
    target = KubeTarget(resource=plural, namespace=ref.namespace, name=ref.name)
    try:
        with kube_call(verb="get", target=target):
            found: dict[str, Any] = custom.get_namespaced_custom_object(
                GROUP, VERSION, ref.namespace, plural, ref.name
            )
    except NotFound:
        raise OwnerGone(f"there is no {kind} {ref.namespace}/{ref.name}") from None
    uid = (found.get("metadata") or {}).get("uid")
    if not ref.uid or uid != ref.uid:
        raise ForgedRequest(
            f"{kind} {ref.namespace}/{ref.name} has uid {uid}, the request names {ref.uid!r}"
        )
    return found


def kama_pod(
    core: k8s.CoreV1Api,
    *,
    policy: TenancyPolicy,
    namespace: str,
    name: str,
    role: str,
    owner_kind: str,
) -> k8s.V1Pod | None:
    """The pod, if it is one Kama created (managed by Kama, in `role`, controlled by a
    `owner_kind`) in a served namespace; None when it is gone; ForgedRequest when it
    is someone else's."""
    check_served(policy, namespace)
    target = KubeTarget(resource="pods", namespace=namespace, name=name)
    try:
        with kube_call(verb="get", target=target):
            pod: k8s.V1Pod = core.read_namespaced_pod(name, namespace)
    except NotFound:
        return None
    meta = pod.metadata
    labels = (meta.labels if meta else None) or {}
    owners = (meta.owner_references if meta else None) or []
    if (
        labels.get(MANAGED_BY_LABEL) != "kama"
        or labels.get(ROLE_LABEL) != role
        or not any(o.kind == owner_kind and o.controller for o in owners)
    ):
        raise ForgedRequest(
            f"pod {namespace}/{name} is not a Kama {role} pod (labels "
            f"{MANAGED_BY_LABEL}=kama, {ROLE_LABEL}={role} and a {owner_kind} owner)"
        )
    return pod
