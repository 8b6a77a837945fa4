"""Client construction for Kama's processes: the Kubernetes API client (in-cluster
service account, else KUBECONFIG) and the Temporal client, built in one place so
every process connects the same way."""

from __future__ import annotations

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from temporalio.client import Client

from kama.config import Settings


def kube_api() -> k8s.ApiClient:
    """In-cluster credentials inside a pod, else KUBECONFIG / ~/.kube/config."""
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()
    return k8s.ApiClient()


async def connect_temporal(settings: Settings) -> Client:
    return await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace)
