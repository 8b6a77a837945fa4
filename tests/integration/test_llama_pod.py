"""A llama-server Pod on the process node: model on a PVC mounted read-only, Ready
through its readiness probe, answering on its own pod IP, gone after deletion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from kama.testing.gguf_factory import ModelShape, write_model
from localstack.stack import LLAMA_IMAGE, LocalStack
from tests.support import apply, eventually, get_json, kubectl, pid_alive


def model_claim(stack: LocalStack, namespace: str) -> Path:
    apply(
        stack,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "models", "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    volume = eventually(
        lambda: get_json(stack, "pvc", "models", "-n", namespace)["spec"].get("volumeName"),
        timeout=60,
        what="the claim to bind",
    )
    return Path(get_json(stack, "pv", volume)["spec"]["hostPath"]["path"])


def llama_pod(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 10,
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532},
            "containers": [
                {
                    "name": "llama",
                    "image": LLAMA_IMAGE,
                    "args": [
                        "--model",
                        "/models/tiny.gguf",
                        "--host",
                        "$(POD_IP)",
                        "--port",
                        "8080",
                        "--ctx-size",
                        "512",
                        "--parallel",
                        "2",
                    ],
                    "env": [
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ],
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "readinessProbe": {
                        "httpGet": {"path": "/health", "port": 8080},
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
                {
                    "name": "models",
                    "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
                }
            ],
        },
    }


def ready_pod(stack: LocalStack, namespace: str, name: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pod = get_json(stack, "pod", name, "-n", namespace)
        conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
        return pod if conds.get("Ready") == "True" else None

    return eventually(ready, timeout=90, what=f"pod {name} Ready")


def container_pid(pod: dict[str, Any]) -> int:
    return int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("process://"))


def test_llama_server_pod_serves_and_stops(stack: LocalStack, namespace: str) -> None:
    volume = model_claim(stack, namespace)
    write_model(volume / "tiny.gguf", shape=ModelShape())
    apply(stack, llama_pod("llama-a", namespace), llama_pod("llama-b", namespace))
    pod_a, pod_b = ready_pod(stack, namespace, "llama-a"), ready_pod(stack, namespace, "llama-b")
    ip_a, ip_b = pod_a["status"]["podIP"], pod_b["status"]["podIP"]
    assert ip_a != ip_b, "every pod gets its own loopback IP so both can listen on 8080"

    with httpx.Client(timeout=30) as http:
        completion = http.post(
            f"http://{ip_a}:8080/completion",
            json={"prompt": "Hello", "n_predict": 8, "temperature": 0, "ignore_eos": True},
        )
        assert completion.status_code == 200
        assert completion.json()["tokens_predicted"] == 8
        chat = http.post(
            f"http://{ip_b}:8080/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
                "temperature": 0,
            },
        )
        assert chat.status_code == 200
        assert chat.json()["choices"][0]["message"]["role"] == "assistant"
        props = http.get(f"http://{ip_a}:8080/props").json()
        assert props["total_slots"] == 2 and props["model_path"] == "/models/tiny.gguf"

    # the model directory is read-only inside the pod even though the PV is writable
    assert (volume / "tiny.gguf").exists()

    pid_a, pid_b = container_pid(pod_a), container_pid(pod_b)
    assert pid_alive(pid_a) and pid_alive(pid_b)
    kubectl(stack, "delete", "pod", "llama-a", "-n", namespace, "--wait=true", "--timeout=60s")
    assert not pid_alive(pid_a)
    kubectl(stack, "delete", "pod", "llama-b", "-n", namespace, "--grace-period=0", "--force")
    eventually(
        lambda: not pid_alive(pid_b), timeout=15, what="the force-deleted pod's process to exit"
    )
    assert kubectl(stack, "get", "pod", "-n", namespace, "-o", "name").stdout.strip() == ""
