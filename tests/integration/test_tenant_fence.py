"""The worker's NetworkPolicies around tenant pods (`activities.tenant_fence`) against
the real API server: both of the chart's policies created in a namespace before its
first tenant pod, once per process; one already there (the chart's, or the tenant's
own, which guards only its own pods) left as it is; none configured, none made."""

from __future__ import annotations

import json

from kubernetes import client as k8s

from activities.tenant_fence import FENCE_LABELS, TenantFence
from kamadev.stack import LocalStack
from tests.conftest import chart_tenant_network_policies


def policies_in(stack: LocalStack, namespace: str) -> dict[str, k8s.V1NetworkPolicy]:
    found = k8s.NetworkingV1Api(stack.api_client()).list_namespaced_network_policy(namespace)
    return {p.metadata.name: p for p in found.items}


def test_the_charts_policies_are_made_once_and_a_tenants_own_is_kept(
    stack: LocalStack, namespace: str
) -> None:
    policies = json.loads(chart_tenant_network_policies())
    fence = TenantFence(api=stack.api_client(), policies=policies)
    networking = k8s.NetworkingV1Api(stack.api_client())
    own = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": "kama-importer-pods"},
           "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}  # fmt: skip
    networking.create_namespaced_network_policy(namespace, own)

    fence.ensure(namespace)
    made = policies_in(stack, namespace)
    assert set(made) == {"kama-serving-pods", "kama-importer-pods"}
    serving = made["kama-serving-pods"]
    assert serving.metadata.labels == FENCE_LABELS
    assert serving.spec.policy_types == ["Ingress", "Egress"] and not serving.spec.egress
    assert made["kama-importer-pods"].spec.pod_selector.match_labels is None, "the tenant's kept"

    networking.delete_namespaced_network_policy("kama-serving-pods", namespace)
    fence.ensure(namespace)  # this process fenced it already: no second call
    assert "kama-serving-pods" not in policies_in(stack, namespace)
    TenantFence(api=stack.api_client(), policies=policies).ensure(namespace)  # a restart
    assert "kama-serving-pods" in policies_in(stack, namespace)

    TenantFence(api=stack.api_client(), policies=()).ensure(f"{namespace}-none")  # no call
