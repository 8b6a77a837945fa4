"""The local control plane with its real nodes behaves like a cluster to kubectl:
CRDs and custom resources, Jobs through the controller-manager, the real scheduler
with fake GPU nodes, volumes, env, logs and failure reporting."""

from __future__ import annotations

import ipaddress
import uuid
from pathlib import Path
from typing import Any

from kamadev.demo import claim_manifest
from kamadev.stack import SHELL_IMAGE, GPUNode, LocalStack
from tests.support import apply, eventually, get_json, kubectl

WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.kama.dev"},
    "spec": {
        "group": "test.kama.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"size": {"type": "integer", "minimum": 1}},
                            }
                        },
                    }
                },
                "additionalPrinterColumns": [
                    {"name": "SIZE", "type": "integer", "jsonPath": ".spec.size"}
                ],
            }
        ],
    },
}


def shell_pod(name: str, script: str, *, restart: str = "Never", **extra: Any) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": SHELL_IMAGE,
        "command": ["sh", "-c", script],
        **extra.pop("container", {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart,
            "containers": [container],
            "terminationGracePeriodSeconds": 5,
            **extra,
        },
    }


def pod_phase(stack: LocalStack, ns: str, name: str, *phases: str) -> dict[str, Any] | None:
    pod = get_json(stack, "pod", name, "-n", ns)
    return pod if pod.get("status", {}).get("phase") in phases else None


def test_crd_and_custom_resource_with_kubectl(stack: LocalStack, namespace: str) -> None:
    apply(stack, WIDGET_CRD)
    kubectl(
        stack, "wait", "--for=condition=Established", "crd/widgets.test.kama.dev", "--timeout=60s"
    )
    widget = {
        "apiVersion": "test.kama.dev/v1",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": 3},
    }
    eventually(
        lambda: (
            kubectl(
                stack,
                "apply",
                "-n",
                namespace,
                "-f",
                "-",
                input=str(widget).replace("'", '"'),
                check=False,
            ).returncode
            == 0
        ),
        timeout=30,
        what="the Widget to be accepted",
    )
    out = kubectl(stack, "get", "widgets", "-n", namespace).stdout
    assert "w1" in out and "SIZE" in out and "3" in out
    bad = {**widget, "metadata": {"name": "w2"}, "spec": {"size": 0}}
    rejected = kubectl(
        stack, "apply", "-n", namespace, "-f", "-", input=str(bad).replace("'", '"'), check=False
    )
    assert rejected.returncode != 0 and "spec.size" in rejected.stderr


def test_job_completes_and_failing_container_reports_exit_code(
    stack: LocalStack, namespace: str
) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "hello"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": SHELL_IMAGE,
                            "command": ["sh", "-c", "echo job-ran-$((6*7))"],
                        }
                    ],
                }
            },
        },
    }
    apply(stack, {**job, "metadata": {"name": "hello", "namespace": namespace}})
    kubectl(
        stack, "wait", "--for=condition=Complete", "job/hello", "-n", namespace, "--timeout=90s"
    )
    assert "job-ran-42" in kubectl(stack, "logs", "job/hello", "-n", namespace).stdout

    apply(
        stack,
        {
            **shell_pod("fails", "echo about to fail; exit 3"),
            "metadata": {"name": "fails", "namespace": namespace},
        },
    )
    pod = eventually(
        lambda: pod_phase(stack, namespace, "fails", "Failed"), timeout=60, what="pod Failed"
    )
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3 and terminated["reason"] == "Error"
    assert "about to fail" in kubectl(stack, "logs", "fails", "-n", namespace).stdout


def test_scheduler_binds_gpu_pods_to_fake_gpu_nodes(stack: LocalStack, namespace: str) -> None:
    node = f"gpu-{uuid.uuid4().hex[:6]}"
    stack.add_gpu_node(GPUNode(name=node, gpus=2))
    labels = get_json(stack, "node", node)["metadata"]["labels"]
    assert labels["nvidia.com/gpu.count"] == "2" and labels["nvidia.com/gpu.product"].startswith(
        "NVIDIA"
    )

    def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
        pod = shell_pod(
            name, "sleep 3600", container={"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
        )
        pod["metadata"]["namespace"] = namespace
        return pod

    apply(stack, gpu_pod("two-gpus", 2), gpu_pod("eight-gpus", 8))
    bound = eventually(
        lambda: get_json(stack, "pod", "two-gpus", "-n", namespace)["spec"].get("nodeName"),
        timeout=60,
        what="the 2-GPU pod to be scheduled",
    )
    assert bound == node

    def unschedulable() -> dict[str, Any] | None:
        pod = get_json(stack, "pod", "eight-gpus", "-n", namespace)
        cond = {c["type"]: c for c in pod["status"].get("conditions", [])}.get("PodScheduled")
        return cond if cond and cond["status"] == "False" else None

    cond = eventually(unschedulable, timeout=60, what="the 8-GPU pod to be reported unschedulable")
    assert cond["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond["message"]
    assert get_json(stack, "pod", "eight-gpus", "-n", namespace)["status"]["phase"] == "Pending"
    kubectl(stack, "delete", "node", node, "--wait=false")


def test_env_from_secret_configmap_and_downward_api(stack: LocalStack, namespace: str) -> None:
    kubectl(
        stack,
        "create",
        "secret",
        "generic",
        "creds",
        "-n",
        namespace,
        "--from-literal=token=s3cr3t",
    )
    kubectl(stack, "create", "configmap", "settings", "-n", namespace, "--from-literal=mode=fast")
    pod = shell_pod(
        "env",
        'echo "token=$TOKEN mode=$MODE ip=$POD_IP name=$POD_NAME"; cat /etc/settings/mode',
        container={
            "env": [
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                {
                    "name": "MODE",
                    "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}},
                },
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ],
            "volumeMounts": [{"name": "settings", "mountPath": "/etc/settings"}],
        },
        volumes=[{"name": "settings", "configMap": {"name": "settings"}}],
    )
    pod["metadata"]["namespace"] = namespace
    apply(stack, pod)
    done = eventually(
        lambda: pod_phase(stack, namespace, "env", "Succeeded", "Failed"),
        timeout=60,
        what="env pod to finish",
    )
    logs = kubectl(stack, "logs", "env", "-n", namespace).stdout
    assert done["status"]["phase"] == "Succeeded", logs
    ip = done["status"]["podIP"]
    node_ranges = [
        ipaddress.ip_network(stack.nodes.addresses.pod_cidr(i)) for i in range(stack.nodes.count)
    ]
    assert any(ipaddress.ip_address(ip) in pods for pods in node_ranges), ip
    assert f"token=s3cr3t mode=fast ip={ip} name=env" in logs
    assert logs.strip().endswith("fast")


def test_read_only_volume_rejects_writes(stack: LocalStack, namespace: str) -> None:
    apply(stack, claim_manifest(name="data", namespace=namespace))
    writer = shell_pod(
        "writer",
        "echo hello > /data/greeting && echo scratch > /scratch/x && cat /scratch/x",
        volumes=[
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "scratch", "emptyDir": {}},
        ],
        container={
            "volumeMounts": [
                {"name": "data", "mountPath": "/data"},
                {"name": "scratch", "mountPath": "/scratch"},
            ]
        },
    )
    writer["metadata"]["namespace"] = namespace
    apply(stack, writer)
    done = eventually(
        lambda: pod_phase(stack, namespace, "writer", "Succeeded", "Failed"),
        timeout=60,
        what="writer to finish",
    )
    assert done["status"]["phase"] == "Succeeded", kubectl(
        stack, "logs", "writer", "-n", namespace
    ).stdout

    reader = shell_pod(
        "reader",
        "cat /data/greeting; echo overwrite > /data/greeting",
        volumes=[
            {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}}
        ],
        container={"volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}]},
    )
    reader["metadata"]["namespace"] = namespace
    apply(stack, reader)
    done = eventually(
        lambda: pod_phase(stack, namespace, "reader", "Succeeded", "Failed"),
        timeout=60,
        what="reader to finish",
    )
    logs = kubectl(stack, "logs", "reader", "-n", namespace).stdout
    assert done["status"]["phase"] == "Failed"
    assert "hello" in logs and "Read-only file system" in logs
    pv = get_json(stack, "pvc", "data", "-n", namespace)["spec"]["volumeName"]
    host_path = get_json(stack, "pv", pv)["spec"]["hostPath"]["path"]
    assert Path(host_path, "greeting").read_text() == "hello\n"


def test_unknown_image_is_not_run(stack: LocalStack, namespace: str) -> None:
    pod = shell_pod("mystery", "true")
    pod["spec"]["containers"][0]["image"] = "registry.example/unknown:1"
    pod["metadata"]["namespace"] = namespace
    apply(stack, pod)

    def waiting() -> dict[str, Any] | None:
        statuses = (
            get_json(stack, "pod", "mystery", "-n", namespace)
            .get("status", {})
            .get("containerStatuses")
            or []
        )
        state = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return state if state.get("reason") == "ErrImagePull" else None

    state = eventually(waiting, timeout=60, what="ErrImagePull")
    # nodes never pull: every registry resolves to a closed local port
    assert "registry.example/unknown:1" in state["message"] and "127.0.0.1:1" in state["message"]
    assert get_json(stack, "pod", "mystery", "-n", namespace)["status"]["phase"] == "Pending"


def test_failing_liveness_probe_restarts_container(stack: LocalStack, namespace: str) -> None:
    pod = shell_pod(
        "flaky",
        "sleep 3600",
        restart="Always",
        container={
            "livenessProbe": {
                "exec": {"command": ["sh", "-c", "exit 1"]},
                "periodSeconds": 1,
                "failureThreshold": 2,
            },
        },
    )
    pod["metadata"]["namespace"] = namespace
    apply(stack, pod)

    def restarted() -> int | None:
        statuses = (
            get_json(stack, "pod", "flaky", "-n", namespace)
            .get("status", {})
            .get("containerStatuses")
            or []
        )
        count = statuses[0]["restartCount"] if statuses else 0
        return count if count >= 1 else None

    eventually(restarted, timeout=60, what="a restart after liveness failures")
    events = kubectl(
        stack, "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=flaky"
    ).stdout
    assert "Unhealthy" in events
