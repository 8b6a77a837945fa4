"""The demo that `make dev` runs on the local stack: a llama-server Pod serving a
generated GGUF model from a PVC, reachable on its own pod IP."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from kamadev.gguf_factory import ModelShape, write_model
from kamadev.stack import KAMA_LLAMA_IMAGE, LocalStack

LLAMA_PORT = 8080


def claim_manifest(*, name: str, namespace: str, size: str = "1Gi") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
    }


def llama_pod_manifest(
    *, name: str, namespace: str, claim: str, model_file: str, parallel: int = 2
) -> dict[str, Any]:
    """A hardened llama-server Pod: non-root, read-only root and model volume."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "llama-demo"}},
        "spec": {
            "terminationGracePeriodSeconds": 10,
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532},
            "containers": [
                {
                    "name": "llama",
                    "image": KAMA_LLAMA_IMAGE,  # llama-server itself, not `kama runtime`
                    "command": ["/usr/local/bin/llama-server"],
                    "args": [
                        "--model",
                        f"/models/{model_file}",
                        "--host",
                        "$(POD_IP)",
                        "--port",
                        str(LLAMA_PORT),
                        "--ctx-size",
                        str(256 * parallel),
                        "--parallel",
                        str(parallel),
                    ],
                    "env": [
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ],
                    "ports": [{"name": "http", "containerPort": LLAMA_PORT}],
                    "readinessProbe": {
                        "httpGet": {"path": "/health", "port": LLAMA_PORT},
                        "periodSeconds": 1,
                    },
                    "securityContext": {
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
                }
            ],
            "volumes": [
                {"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
            ],
        },
    }


def claim_host_path(*, core: k8s.CoreV1Api, name: str, namespace: str, timeout: float = 60) -> Path:
    """Wait for the claim to bind and return the PV's directory on this machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        claim = core.read_namespaced_persistent_volume_claim(name, namespace)
        if claim.spec.volume_name and claim.status.phase == "Bound":
            pv = core.read_persistent_volume(claim.spec.volume_name)
            return Path(pv.spec.host_path.path)
        time.sleep(0.2)
    raise TimeoutError(f"claim {namespace}/{name} did not bind in {timeout}s")


def wait_pod_ready(*, core: k8s.CoreV1Api, name: str, namespace: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        conditions = {c.type: c.status for c in (pod.status.conditions or [])}
        if conditions.get("Ready") == "True":
            return pod
        time.sleep(0.25)
    raise TimeoutError(f"pod {namespace}/{name} not Ready after {timeout}s")


def run_demo(stack: LocalStack, *, namespace: str = "kama-demo") -> str:
    """Create the demo model and pod; returns the pod IP once it is Ready."""
    core = stack.core()
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    core.create_namespaced_persistent_volume_claim(
        namespace, claim_manifest(name="models", namespace=namespace)
    )
    directory = claim_host_path(core=core, name="models", namespace=namespace)
    write_model(directory / "tiny.gguf", shape=ModelShape())
    deadline = time.monotonic() + 60
    while True:  # the default service account appears shortly after the namespace
        try:
            core.create_namespaced_pod(
                namespace,
                llama_pod_manifest(
                    name="llama", namespace=namespace, claim="models", model_file="tiny.gguf"
                ),
            )
            break
        except k8s.ApiException as exc:
            if exc.status != 403 or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    pod = wait_pod_ready(core=core, name="llama", namespace=namespace)
    return str(pod.status.pod_ip)
