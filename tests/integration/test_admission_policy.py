"""The chart's ValidatingAdmissionPolicy on the local stack: the pods the worker's
ServiceAccount submits are admitted only in Kama's shape, whatever the worker was told.

The chart is installed in the namespaced mode with every component at zero replicas (no
Kama process is needed: the test submits pods itself, impersonating the worker's
ServiceAccount, whose Role allows creating and patching pods here). Kama's own serving
and importer pod manifests (kama/serving_pod.py, kama/importer_pod.py, with the chart's
images) are admitted; the serving pod with one thing changed is refused with the
message of the rule it breaks; the same hostPath pod from another user is not the
policy's business; and a pod the worker already made may be relabelled (draining) but
not given another image.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kama.contracts import ObjectRef
from kama.importer_pod import (
    ImporterMounts,
    ImporterPodOptions,
    ImporterTemplate,
    importer_pod_manifest,
)
from kama.serving_plan import ServingPlan
from kama.serving_pod import DRAINING_LABEL, ServingTemplate, serving_pod_manifest
from kamadev.chart import CHART, RELEASE, helm, local_stack_values
from kamadev.stack import KAMA_IMAGE, KAMA_LLAMA_IMAGE, LocalStack
from tests.support import eventually, kubectl

WORKER_SA = f"{RELEASE}-worker"
HOST_PATH = "Kama worker pods may not mount hostPath volumes"
Pod = dict[str, Any]


@pytest.fixture
def installed(stack: LocalStack, namespace: str, tmp_path: Path) -> Iterator[str]:
    """The chart in `namespace`, serving that namespace, no Kama process running."""
    idle = {"replicas": 0}
    values = {
        **local_stack_values(hub_url="http://hub.invalid"),
        "crds": {"install": False},
        "watchNamespaces": [namespace],
        "temporal": {"address": "temporal.invalid:7233"},
        "worker": idle,
        "watcher": idle,
        "gateway": idle,
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    helm(stack, "install", RELEASE, str(CHART), "-n", namespace, "-f", str(values_file),
         "--wait", "--timeout", "2m")  # fmt: skip
    try:
        yield namespace
    finally:
        helm(stack, "uninstall", RELEASE, "-n", namespace, "--ignore-not-found", "--wait",
             "--timeout", "90s", check=False)  # fmt: skip


def kama_pod(namespace: str, name: str) -> Pod:
    """Kama's serving pod manifest with the chart's runtime image, without an owner."""
    template = ServingTemplate(
        image=KAMA_LLAMA_IMAGE,
        plan=ServingPlan(
            entrypoint="m.gguf", manifest_digest="0" * 64, ctx_total=512, concurrency=1
        ),
        claim_name="kama-cache-models",
        sub_path="blobs/sha256/" + "0" * 64,
        cpu_request="10m",
        memory_request="64Mi",
    )
    pod = serving_pod_manifest(
        template=template, namespace=namespace, deployment="shape", deployment_uid="", ordinal=0
    )
    pod["metadata"]["name"] = name
    del pod["metadata"]["ownerReferences"]
    return pod


def importer_pod(namespace: str, name: str) -> Pod:
    """Kama's importer pod manifest with the chart's kama image, without an owner."""
    template = ImporterTemplate(
        image=KAMA_IMAGE,
        hf_endpoint="http://hub.invalid",
        options=ImporterPodOptions(ca_configmap="corp-ca"),
    )
    pod = importer_pod_manifest(
        template=template,
        name=name,
        owner=ObjectRef(namespace=namespace, name="shape", uid="0"),
        operation_id="op-1",
        token="t" * 32,
        mounts=ImporterMounts(cache_claim="kama-cache-models", token_secret="hf", token_key="k"),
    )
    del pod["metadata"]["ownerReferences"]
    return pod


def as_worker(
    stack: LocalStack, namespace: str, *args: str, body: Pod | None = None
) -> tuple[bool, str]:
    """Run a kubectl request as the chart's worker ServiceAccount; (accepted, stderr)."""
    result = kubectl(
        stack, *args, "-n", namespace,
        f"--as=system:serviceaccount:{namespace}:{WORKER_SA}",
        input=json.dumps(body) if body is not None else None, check=False,
    )  # fmt: skip
    return result.returncode == 0, result.stderr


def worker_core(stack: LocalStack, namespace: str) -> k8s.CoreV1Api:
    """A Kubernetes client that acts as the chart's worker ServiceAccount."""
    api = stack.api_client()
    api.set_default_header("Impersonate-User", f"system:serviceaccount:{namespace}:{WORKER_SA}")
    return k8s.CoreV1Api(api)


def submit(stack: LocalStack, namespace: str, pod: Pod) -> tuple[bool, str]:
    """Create `pod` as the worker, server-side dry run (admission runs, nothing is kept)."""
    return as_worker(stack, namespace, "create", "--dry-run=server", "-f", "-", body=pod)


def with_host_path(pod: Pod) -> None:
    pod["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "root", "mountPath": "/host"})


def container_security(**fields: Any) -> Callable[[Pod], None]:
    def change(pod: Pod) -> None:
        pod["spec"]["containers"][0]["securityContext"].update(fields)

    return change


def pod_field(**fields: Any) -> Callable[[Pod], None]:
    def change(pod: Pod) -> None:
        pod["spec"].update(fields)

    return change


def no_role(pod: Pod) -> None:
    del pod["metadata"]["labels"]["kama.dev/role"]


def init_container_image(pod: Pod) -> None:
    pod["spec"]["initContainers"] = [
        {
            "name": "fetch",
            "image": "docker.io/library/busybox:1.36",
            "securityContext": {"allowPrivilegeEscalation": False},
        }
    ]


def other_image(pod: Pod) -> None:
    pod["spec"]["containers"][0]["image"] = KAMA_IMAGE + "-other"


def shell_command(pod: Pod) -> None:
    pod["spec"]["containers"][0]["command"] = ["/opt/kama/bin/python", "-c", "print(1)"]


# one change each to Kama's pod, and the rule (message) that refuses it
BROKEN: list[tuple[str, Callable[[Pod], None], str]] = [
    ("hostPath", with_host_path, HOST_PATH),
    ("image", other_image, "Kama worker pods may run only the chart's images"),
    ("init image", init_container_image, "Kama worker pods may run only the chart's images"),
    ("command", shell_command, "Kama worker pods may not override the image's entrypoint"),
    ("hostNetwork", pod_field(hostNetwork=True), "Kama worker pods may not use the node's"),
    # a pod in the node's PID namespace cannot share its own (the API server's rule)
    ("hostPID", pod_field(hostPID=True, shareProcessNamespace=False),
     "Kama worker pods may not use the node's"),
    ("privileged", container_security(privileged=True, allowPrivilegeEscalation=True),
     "Kama worker pods may not run privileged containers"),
    ("capabilities", container_security(capabilities={"add": ["NET_ADMIN"]}),
     "Kama worker pods may not add Linux capabilities"),
    ("token", pod_field(automountServiceAccountToken=True),
     "Kama worker pods may not carry a service-account token"),
    ("labels", no_role, "Kama worker pods must carry the labels"),
]  # fmt: skip


def test_worker_pods_are_admitted_only_in_kamas_shape(stack: LocalStack, installed: str) -> None:
    namespace = installed
    hostile = kama_pod(namespace, "hostile")
    with_host_path(hostile)

    # the policy is in force (policies reach the API server's informer within seconds)
    def refused() -> str | None:
        accepted, stderr = submit(stack, namespace, hostile)
        return None if accepted else stderr

    stderr = eventually(refused, timeout=30, what="the hostPath pod refused")
    assert HOST_PATH in stderr, stderr
    assert f"{RELEASE}-{namespace}-worker-pods" in stderr, stderr

    # Kama's own pods are admitted, and so is the hostPath pod from another user
    for pod in (kama_pod(namespace, "kama-shaped"), importer_pod(namespace, "importer")):
        accepted, stderr = submit(stack, namespace, pod)
        assert accepted, f"{pod['metadata']['name']}: {stderr}"
    admin = kubectl(stack, "create", "--dry-run=server", "-f", "-", "-n", namespace,
                    input=json.dumps(hostile), check=False)  # fmt: skip
    assert admin.returncode == 0, admin.stderr

    # each rule refuses its own breach, naming the rule
    for what, change, message in BROKEN:
        pod = kama_pod(namespace, f"broken-{what.replace(' ', '-').lower()}")
        change(pod)
        accepted, stderr = submit(stack, namespace, pod)
        assert not accepted, f"{what}: admitted"
        assert message in stderr, f"{what}: {stderr}"

    # a pod the worker made: the draining label is admitted, another image is not (the
    # worker's own call, activities/serving_pods.py mark_draining, as its ServiceAccount)
    accepted, stderr = as_worker(stack, namespace, "create", "-f", "-",
                                 body=kama_pod(namespace, "made"))  # fmt: skip
    assert accepted, stderr
    core = worker_core(stack, namespace)
    label = {"metadata": {"labels": {DRAINING_LABEL: "true"}}}
    core.patch_namespaced_pod("made", namespace, label, dry_run="All")
    image = [{"op": "replace", "path": "/spec/containers/0/image", "value": KAMA_IMAGE + "-x"}]
    with pytest.raises(ApiException) as refusal:
        core.patch_namespaced_pod("made", namespace, image, dry_run="All")
    assert refusal.value.status == 422  # a ValidatingAdmissionPolicy's default reason, Invalid
    assert "Kama worker pods may run only the chart's images" in str(refusal.value.body)
    kubectl(stack, "delete", "pod", "made", "-n", namespace, "--wait=false", check=False)
