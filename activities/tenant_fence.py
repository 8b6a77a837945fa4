"""NetworkPolicies around tenant pods in every namespace the worker creates one in.

In the namespaced mode the chart renders the policies of serving and importer pods
into each watched namespace; in the cluster-wide mode it cannot know the namespaces,
so tenant pods were open to every pod of the cluster (another tenant could call a
serving pod's supervisor or an importer's port). So the chart hands the same policies
to the worker (`KAMA_TENANT_NETWORK_POLICIES`), and before the worker creates a
serving or importer pod in a namespace it creates them there: only Kama's gateway and
worker reach serving pods, which reach nothing themselves (no egress: llama-server
fetches no URL), and only the worker reaches importer pods. Created once per namespace
and process (a policy already there, the chart's or a tenant's, is left as it is: it
guards that tenant's own pods); idempotent, so a retried activity does no harm."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any, Final

from kubernetes import client as k8s

from activities.kube_errors import Conflict, KubeTarget, kube_call

FENCE_LABELS: Final = {
    "app.kubernetes.io/managed-by": "kama-worker",
    "kama.dev/fence": "tenant-pods",
}


class TenantFence:
    """Creates the configured NetworkPolicies in a namespace before its first tenant pod."""

    def __init__(self, *, api: k8s.ApiClient, policies: Sequence[Mapping[str, Any]]) -> None:
        self.networking = k8s.NetworkingV1Api(api)
        self.policies = tuple(policies)
        self._fenced: set[str] = set()
        self._lock = threading.Lock()

    def ensure(self, namespace: str) -> None:
        """The policies exist in `namespace` (created now if this process has not yet)."""
        if not self.policies:
            return
        with self._lock:
            if namespace in self._fenced:
                return
        for policy in self.policies:
            manifest = {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {
                    "name": policy["name"],
                    "namespace": namespace,
                    "labels": FENCE_LABELS,
                },
                "spec": policy["spec"],
            }
            target = KubeTarget(
                resource="networkpolicies", namespace=namespace, name=policy["name"]
            )
            with suppress(Conflict), kube_call(verb="create", target=target):
                self.networking.create_namespaced_network_policy(namespace, manifest)
        with self._lock:
            self._fenced.add(namespace)
