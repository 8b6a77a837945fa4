"""Kama as a user installs it: the images built without Docker, and the Helm chart on the
local stack, whose API server enforces RBAC.

- The images: two builds from clean caches give the same digests; the llama-server
  image's root filesystem (unpacked by umoci) runs `kama --help`, imports every process
  and runs `llama-server --version` as uid 65532, and has no shell.
- The chart: `helm install` in the namespaced mode with evaluation mode's in-cluster
  Temporal dev server, then the whole path through the chart-installed worker, watcher
  and gateway pods (in-cluster config from their projected service-account tokens):
  ModelCache + ModelArtifact imported from the local Hub, a ModelDeployment at zero, a
  chat request to the gateway pod's IP wakes it, the answer, idle back to zero. Every
  component's `kubectl auth can-i --list` matches deploy/chart/kama/rbac-expected/, with
  explicit denials; `helm uninstall` leaves the CRDs and every Kama resource in place.

The stack has no cluster DNS or Service proxy, so the chart is installed with its Kama
components at zero replicas first, and an upgrade points them at the dev server's pod IP.
Other tests' Kama (the host-process `kama_control` fixture, if this session started it)
watches every namespace; a ValidatingAdmissionPolicy fences it out of this test's
namespace, so the chart-installed Kama alone serves these resources.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kamadev.binaries import REPO_ROOT, build_images, ensure_helm
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.hub import HubFixture
from kamadev.processes import free_port
from kamadev.stack import LocalStack
from tests.integration.test_artifact_plane import cache, condition, hf_artifact
from tests.support import apply, eventually, get_json, kubectl

CHART = REPO_ROOT / "deploy" / "chart" / "kama"
RBAC_TABLES = CHART / "rbac-expected"
RELEASE = "kama"
COMPONENTS = ("worker", "watcher", "gateway")
HOST_KAMA_USER = "kama-admin"  # the stack's admin certificate, which host-process Kama uses
SMALL = {"requests": {"cpu": "10m", "memory": "64Mi"}}


# --- images ---------------------------------------------------------------------------


def _in_rootfs(rootfs: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run a program of the image's root filesystem as the image's user (65532)."""
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    return subprocess.run(
        [chroot, "--userspec=65532:65532", str(rootfs), *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/opt/kama/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/home/nonroot"},
        timeout=120,
        check=False,
    )


def source_snapshot(target: Path) -> Path:
    """What the kama layer is built from, copied once: both builds read the same inputs
    even while someone edits the checkout."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, target / name)
    for package in ("kama", "kamactl", "workflows", "activities", "watcher", "gateway", "runtime"):
        shutil.copytree(REPO_ROOT / package, target / package, ignore=ignore)
    return target


@pytest.mark.skipif(os.geteuid() != 0, reason="mmdebstrap and chroot need root")
def test_images_are_reproducible_and_run_as_nonroot(tmp_path: Path) -> None:
    source = source_snapshot(tmp_path / "source")
    first = build_images(cache=tmp_path / "cache-a", source=source)
    second = build_images(cache=tmp_path / "cache-b", source=source)
    assert set(first) == {"kama", "kama-llama-server", "kama-temporal-dev"}
    assert {n: i.digest for n, i in first.items()} == {n: i.digest for n, i in second.items()}

    server = first["kama-llama-server"]
    index = json.loads((server.layout / "index.json").read_text())
    tag = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
    bundle = tmp_path / "bundle"
    unpack = subprocess.run(
        ["umoci", "unpack", "--rootless", "--image", f"{server.layout}:{tag}", str(bundle)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert unpack.returncode == 0, unpack.stderr
    process = json.loads((bundle / "config.json").read_text())["process"]
    assert process["user"] == {"uid": 65532, "gid": 65532}
    assert process["args"] == ["/opt/kama/bin/kama", "runtime"]
    rootfs = bundle / "rootfs"
    assert not (rootfs / "bin" / "sh").exists() and not (rootfs / "usr" / "bin" / "bash").exists()

    help_ = _in_rootfs(rootfs, "/opt/kama/bin/kama", "--help")
    assert help_.returncode == 0 and "worker" in help_.stdout, help_.stderr
    imports = _in_rootfs(
        rootfs,
        "/opt/kama/bin/python",
        "-c",
        "import kamactl.worker, kamactl.watcher, gateway.app, runtime.supervisor, "
        "activities.huggingface, activities.cache",
    )
    assert imports.returncode == 0, imports.stderr
    version = _in_rootfs(rootfs, "/usr/local/bin/llama-server", "--version")
    assert version.returncode == 0 and "version" in (version.stdout + version.stderr)


# --- chart ------------------------------------------------------------------------------


def helm(stack: LocalStack, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(ensure_helm()), *args],
        capture_output=True,
        text=True,
        env=stack.helm_env(),
        timeout=300,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


@pytest.fixture
def fenced(stack: LocalStack, namespace: str) -> Iterator[str]:
    """Host-process Kama (other tests' `kama_control`, on the stack's own Temporal) may
    not act in `namespace`: its watcher may still start workflows for the resources here
    once the chart's watcher added the finalizer, but its worker cannot create, label or
    delete pods or write the resources' status, finalizers or scale. The process node
    uses the same certificate: it only writes pod status and events, and deletes pods
    whose deletion has begun. This test itself only creates resources."""
    name = f"kama-fence-{namespace}"
    fenced_writes = (
        "request.resource.group == 'kama.dev' || request.name == 'fence-probe' || "
        "(request.resource.resource == 'pods' && request.subResource == '' && "
        "(request.operation != 'DELETE' || !has(oldObject.metadata.deletionTimestamp)))"
    )
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["kama.dev"],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": ["*/*"],
                    },
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE", "DELETE"],
                        "resources": ["pods"],
                    },
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["configmaps"],
                    },
                ]
            },
            "matchConditions": [
                {
                    "name": "host-kama",
                    "expression": f"request.userInfo.username == '{HOST_KAMA_USER}' && "
                    f"({fenced_writes})",
                }
            ],
            "validations": [{"expression": "false", "message": "fenced off for test_chart"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    apply(stack, policy, binding)

    def probe_refused() -> bool:
        return (
            kubectl(
                stack, "create", "configmap", "fence-probe", "-n", namespace, "--dry-run=server",
                check=False,
            ).returncode
            != 0
        )  # fmt: skip

    eventually(probe_refused, timeout=30, what="the admission fence in force")
    try:
        yield namespace
    finally:
        kubectl(stack, "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
                name, "--ignore-not-found", check=False)  # fmt: skip
        eventually(lambda: not probe_refused(), timeout=30, what="the admission fence lifted")
        release_kama_resources(stack, namespace)


def release_kama_resources(stack: LocalStack, namespace: str) -> None:
    """Delete this namespace's Kama resources without a Kama to release their finalizers."""
    listed = get_json(stack, "modeldeployments,modelartifacts,modelcaches", "-n", namespace)
    for item in listed["items"]:
        ref = f"{item['kind'].lower()}/{item['metadata']['name']}"
        kubectl(stack, "delete", ref, "-n", namespace, "--wait=false", check=False)
        kubectl(stack, "patch", ref, "-n", namespace, "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip


@pytest.fixture
def release(crds: LocalStack, fenced: str) -> Iterator[str]:
    """The namespace the test installs the chart into; uninstalled whatever happens, so
    no pod outlives the test (the stack's teardown counts leftover processes)."""
    try:
        yield fenced
    finally:
        helm(crds, "uninstall", RELEASE, "-n", fenced, "--ignore-not-found", "--wait",
             "--timeout", "90s", check=False)  # fmt: skip


def values(namespace: str, hub: HubFixture) -> dict[str, Any]:
    component = {"replicas": 0, "resources": SMALL}
    return {
        "image": {"registry": "kama.dev"},  # the process node's image map (kamadev/stack.py)
        "images": {k: {"tag": "dev"} for k in ("kama", "llamaServer", "temporalDev")},
        "watchNamespaces": [namespace],
        "listenOnPodIP": True,  # pods share the host's network namespace on the process node
        "huggingFace": {"endpoint": hub.url},
        "temporal": {
            "evaluation": {
                "enabled": True,
                "persistence": {"size": "256Mi"},
                "resources": SMALL,
            }
        },
        "worker": component,
        # 0.0.0.0:8081 would take the serving pods' supervisor port on this node
        "watcher": {**component, "healthPort": free_port()},
        "gateway": component,
    }


def pod_of(stack: LocalStack, namespace: str, component: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pods = get_json(
            stack, "pods", "-n", namespace, "-l", f"app.kubernetes.io/component={component}"
        )["items"]
        ready = [
            p
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
        ]
        return ready[0] if ready else None

    return eventually(running, timeout=120, what=f"a ready {component} pod", interval=0.5)


def can_i_list(stack: LocalStack, namespace: str, sa_namespace: str, component: str) -> str:
    """What `kubectl auth can-i --list` shows a component's ServiceAccount in `namespace`
    beyond what every service account may do (discovery, self reviews: the rows of
    the namespace's `default` account): one rule a line with single spaces, sorted."""

    def rows(account: str) -> list[str]:
        out = kubectl(
            stack, "auth", "can-i", "--list", "-n", namespace,
            f"--as=system:serviceaccount:{sa_namespace}:{account}",
        ).stdout  # fmt: skip
        return [" ".join(line.split()) for line in out.splitlines() if line.strip()]

    header, *granted = rows(f"{RELEASE}-{component}")
    baseline = set(rows("default"))
    return "\n".join([header, *sorted(set(granted) - baseline)]) + "\n"


def check_rbac_table(actual: str, table: str) -> None:
    path = RBAC_TABLES / f"{table}.txt"
    header = (
        "# `kubectl auth can-i --list` of the chart's ServiceAccount minus what every service\n"
        "# account may do, as tests/integration/test_chart.py compares it on the local stack\n"
        "# (KAMA_UPDATE_RBAC_TABLES=1 rewrites this file).\n"
    )
    if os.environ.get("KAMA_UPDATE_RBAC_TABLES"):
        path.write_text(header + actual)
    expected = "".join(
        line for line in path.read_text().splitlines(keepends=True) if not line.startswith("#")
    )
    assert actual == expected, (
        "RBAC differs from "
        + str(path)
        + ":\n"
        + "".join(
            difflib.unified_diff(
                expected.splitlines(True), actual.splitlines(True), "expected", "actual"
            )
        )
    )


def can_i(
    stack: LocalStack, release_namespace: str, component: str, *what: str, namespace: str
) -> bool:
    result = kubectl(
        stack, "auth", "can-i", *what, "-n", namespace,
        f"--as=system:serviceaccount:{release_namespace}:{RELEASE}-{component}", check=False,
    )  # fmt: skip
    return result.stdout.strip() == "yes"


def md_status(stack: LocalStack, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = get_json(stack, "modeldeployment", name, "-n", namespace)
    return obj


def test_chart_installs_kama_that_serves_a_model(
    crds: LocalStack, hub: HubFixture, release: str, tmp_path: Path
) -> None:
    stack, namespace = crds, release
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values(namespace, hub)))
    # the session's CRDs came from `kubectl apply`: the release takes them over, and
    # keeps them on uninstall for the rest of the session
    started = time.monotonic()
    helm(stack, "install", RELEASE, str(CHART), "-n", namespace, "-f", str(values_file),
         "--take-ownership", "--wait", "--timeout", "3m")  # fmt: skip
    temporal_ip = pod_of(stack, namespace, "temporal")["status"]["podIP"]
    attributes = subprocess.run(
        [str(stack.binaries.temporal), "operator", "search-attribute", "list",
         "--address", f"{temporal_ip}:7233", "--output", "json"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    assert all(name in attributes for name in ("KamaKind", "KamaNamespace", "KamaName"))
    helm(stack, "upgrade", RELEASE, str(CHART), "-n", namespace, "--reuse-values",
         "--set", f"temporal.address={temporal_ip}:7233",
         "--set", "worker.replicas=1", "--set", "watcher.replicas=1",
         "--set", "gateway.replicas=1", "--wait", "--timeout", "3m")  # fmt: skip
    installed_s = time.monotonic() - started
    crd = get_json(stack, "crd", "modeldeployments.kama.dev")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"

    # in-cluster configuration: a projected token, no kubeconfig
    worker = pod_of(stack, namespace, "worker")
    assert worker["spec"]["serviceAccountName"] == f"{RELEASE}-worker"
    assert any(
        "serviceAccountToken" in str(v.get("projected", {})) for v in worker["spec"]["volumes"]
    )
    assert not any(e["name"] == "KUBECONFIG" for e in worker["spec"]["containers"][0]["env"])

    # RBAC: the tables, in the served namespace and outside it, and explicit denials
    for component in COMPONENTS:
        check_rbac_table(can_i_list(stack, namespace, namespace, component), component)
        check_rbac_table(can_i_list(stack, "default", namespace, component), f"{component}-outside")
    here, outside = {"namespace": namespace}, {"namespace": "default"}
    assert can_i(stack, namespace, "worker", "create", "pods", **here)
    assert not can_i(stack, namespace, "worker", "create", "pods", **outside)
    assert not can_i(stack, namespace, "worker", "get", "secrets", **here)
    assert not can_i(stack, namespace, "gateway", "create", "pods", **here)
    assert not can_i(stack, namespace, "watcher", "get", "secrets", **here)
    assert not can_i(stack, namespace, "watcher", "list", "modelartifacts.kama.dev", **outside)

    # the whole path through the chart-installed Kama
    repo = f"acme/chart-{uuid.uuid4().hex[:6]}"
    model = write_model(tmp_path / "chart.gguf", shape=ModelShape(n_layer=2, n_ctx=2048, seed=91))
    hub.add_repo(repo, {"model.gguf": model})
    apply(stack, cache(namespace), hf_artifact(namespace, "chart-model", repo, ["model.gguf"]))

    def artifact_ready() -> dict[str, Any] | None:
        obj: dict[str, Any] = get_json(stack, "modelartifact", "chart-model", "-n", namespace)
        found = condition(obj, "Ready")
        return obj if found and found["status"] == "True" else None

    eventually(artifact_ready, timeout=180, what="chart-model Ready", interval=0.5)
    apply(
        stack,
        {
            "apiVersion": "kama.dev/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": "chat", "namespace": namespace},
            "spec": {
                "modelRef": {"name": "chart-model"},
                "runtime": {"contextSize": 1024},
                "resources": {"cpu": "100m"},
                "scaling": {"idleTimeout": "5s", "drainTimeout": "5s"},
            },
        },
    )

    def scaled_to_zero() -> bool:
        found = condition(md_status(stack, namespace, "chat"), "ScaledToZero")
        return bool(found and found["status"] == "True")

    eventually(scaled_to_zero, timeout=120, what="chat at zero replicas", interval=0.5)
    gateway_ip = pod_of(stack, namespace, "gateway")["status"]["podIP"]
    reply = httpx.post(
        f"http://{gateway_ip}:8000/v1/chat/completions",
        json={
            "model": f"{namespace}/chat",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "temperature": 0,
        },
        timeout=180,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] is not None
    chat = md_status(stack, namespace, "chat")
    assert chat["status"].get("lastWake")
    # the workflows ran on the chart's Temporal (evaluation mode), on its worker's queue
    described = subprocess.run(
        [str(stack.binaries.temporal), "workflow", "describe", "--address", f"{temporal_ip}:7233",
         "--workflow-id", f"deployment/{namespace}/chat/{chat['metadata']['uid']}"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert described.returncode == 0 and "kama-control" in described.stdout, described.stderr

    def back_to_zero() -> bool:
        pods = get_json(stack, "pods", "-n", namespace, "-l", "kama.dev/deployment=chat")
        return (
            md_status(stack, namespace, "chat")["spec"].get("replicas") == 0 and not pods["items"]
        )

    try:
        eventually(back_to_zero, timeout=120, what="chat idle back to zero", interval=0.5)
    except AssertionError as exc:
        obj = md_status(stack, namespace, "chat")
        pods = get_json(stack, "pods", "-n", namespace, "-l", "kama.dev/deployment=chat")
        raise AssertionError(
            f"{exc}: spec.replicas={obj['spec'].get('replicas')}, "
            f"conditions={obj.get('status', {}).get('conditions')}, pods="
            f"{[(p['metadata']['name'], p['status'].get('phase'), p['metadata'].get('labels')) for p in pods['items']]}"
        ) from None

    # uninstall: Kama's processes go, the CRDs and every Kama resource stay
    helm(stack, "uninstall", RELEASE, "-n", namespace, "--wait", "--timeout", "2m")
    assert helm(stack, "list", "-n", namespace, "-q").stdout.strip() == ""
    for crd_name in ("modelartifacts", "modelcaches", "modeldeployments"):
        kubectl(stack, "get", "crd", f"{crd_name}.kama.dev")
    assert condition(get_json(stack, "modelartifact", "chart-model", "-n", namespace), "Ready")
    kubectl(stack, "get", "modelcache", "models", "-n", namespace)
    kubectl(stack, "get", "modeldeployment", "chat", "-n", namespace)
    assert not get_json(stack, "deployments", "-n", namespace)["items"]
    print(f"\nchart: installed and upgraded in {installed_s:.1f} s")
