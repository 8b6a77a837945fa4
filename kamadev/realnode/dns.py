"""Cluster DNS for real nodes: CoreDNS as the `kube-dns` Service at 10.96.0.10, run as
a Deployment from the CoreDNS image build-node.sh makes, as kubeadm installs it.

It serves `cluster.local` from the API server (Services, their endpoints, pods) and
nothing else: the stack has no upstream resolver to forward to.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s
from kubernetes import utils as k8s_utils

from kamadev.realnode.addresses import CLUSTER_DNS, CLUSTER_DOMAIN

NAMESPACE = "kube-system"
NAME = "coredns"
COREFILE = f""".:53 {{
    errors
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
"""


def manifests(*, image: str) -> list[dict[str, Any]]:
    labels = {"k8s-app": "kube-dns"}
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "data": {"Corefile": COREFILE},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": NAME,
                        "dnsPolicy": "Default",
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 65532,
                            # port 53 without any capability: this pod's netns only
                            "sysctls": [
                                {"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"}
                            ],
                        },
                        "containers": [
                            {
                                "name": "coredns",
                                "image": image,
                                "imagePullPolicy": "Never",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                                ],
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 1,
                                },
                                "resources": {
                                    "limits": {"memory": "128Mi"},
                                    "requests": {"cpu": "10m", "memory": "32Mi"},
                                },
                                "securityContext": {
                                    "readOnlyRootFilesystem": True,
                                    "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "volumeMounts": [
                                    {
                                        "name": "config",
                                        "mountPath": "/etc/coredns",
                                        "readOnly": True,
                                    }
                                ],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": NAME}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "clusterIP": CLUSTER_DNS,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": 53, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": 53, "protocol": "TCP"},
                ],
            },
        },
    ]


def install(api: k8s.ApiClient, *, image: str) -> None:
    for manifest in manifests(image=image):
        k8s_utils.create_from_dict(api, manifest)
