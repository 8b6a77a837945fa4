"""What Kama's Kubernetes activity classes share: the API clients each one holds, built
from the one `ApiClient` the worker injects, and the delete of a pod that takes a pod
already gone as done (importer and serving pods alike)."""

from __future__ import annotations

from contextlib import suppress

from kubernetes import client as k8s

from activities.kube_errors import KubeTarget, NotFound, kube_call


class KubeClients:
    """The core and custom-object APIs over one injected `ApiClient`."""

    def __init__(self, *, api: k8s.ApiClient) -> None:
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)


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
