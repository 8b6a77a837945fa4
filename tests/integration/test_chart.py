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

import contextlib
import difflib
import hashlib
import itertools
import json
import os
import secrets
import shutil
import subprocess
import threading
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kama.api import minted_key
from kamadev.binaries import REPO_ROOT, build_images
from kamadev.chart import CHART, RELEASE, helm, local_stack_values
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.hub import Fault, HubFixture, sha256_file
from kamadev.stack import LocalStack
from tests.integration.runbook_shell import RUNBOOKS, run_runbook
from tests.integration.test_artifact_plane import cache, condition, hf_artifact
from tests.support import apply, eventually, get_json, kubectl

RBAC_TABLES = CHART / "rbac-expected"
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
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    for package in project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]:
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
    # kama-listen-first listens on the probe port, then execs kama (deploy/images/README.md)
    assert process["args"] == ["/usr/local/bin/kama-listen-first", "/opt/kama/bin/kama", "runtime"]
    rootfs = bundle / "rootfs"
    assert not (rootfs / "bin" / "sh").exists() and not (rootfs / "usr" / "bin" / "bash").exists()

    help_ = _in_rootfs(rootfs, "/usr/local/bin/kama-listen-first", "/opt/kama/bin/kama", "--help")
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


@contextlib.contextmanager
def admission_fence(
    stack: LocalStack,
    namespace: str,
    *,
    name: str,
    rules: list[dict[str, Any]],
    refuse: str,
    message: str,
    who: str = f"request.userInfo.username == '{HOST_KAMA_USER}'",
) -> Iterator[None]:
    """A ValidatingAdmissionPolicy in `namespace` that denies the users CEL `who`
    names (by default the host Kama's certificate) the requests of `rules` for which
    the CEL `refuse` holds, and a `<name>-probe` configmap it always refuses (to the
    test's own admin user too), so the fence is known to be in force before the block
    runs and lifted after it."""
    probe = f"{name}-probe"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    *rules,
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
                    "expression": f"request.name == '{probe}' || (({who}) && ({refuse}))",
                }
            ],
            "validations": [{"expression": "false", "message": message}],
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

    def refused() -> bool:
        return (
            kubectl(
                stack, "create", "configmap", probe, "-n", namespace, "--dry-run=server",
                check=False,
            ).returncode
            != 0
        )  # fmt: skip

    try:
        eventually(refused, timeout=30, what=f"{name} in force")
        yield
    finally:
        kubectl(stack, "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
                name, "--ignore-not-found", check=False)  # fmt: skip
        eventually(lambda: not refused(), timeout=30, what=f"{name} lifted")


@pytest.fixture
def fenced(stack: LocalStack, namespace: str) -> Iterator[str]:
    """Host-process Kama (other tests' `kama_control`, on the stack's own Temporal) may
    not act in `namespace`: its watcher may still start workflows for the resources here
    once the chart's watcher added the finalizer, but its worker cannot create, label or
    delete pods or write the resources' status, finalizers or scale. This test itself
    only creates resources (it changes them as another user, `patch_chat`)."""
    kama_writes = (
        "request.resource.group == 'kama.dev' || "
        "(request.resource.resource == 'pods' && request.subResource == '' && "
        "(request.operation != 'DELETE' || !has(oldObject.metadata.deletionTimestamp)))"
    )
    rules = [
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
    ]
    try:
        with admission_fence(
            stack, namespace, name=f"kama-fence-{namespace}", rules=rules, refuse=kama_writes,
            message="fenced off for test_chart",
        ):  # fmt: skip
            yield namespace
    finally:
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
    local = local_stack_values(hub_url=hub.url)
    return {
        **local,
        "watchNamespaces": [namespace],
        "temporal": {
            "evaluation": {
                "enabled": True,
                "persistence": {"size": "256Mi"},
                "resources": SMALL,
            }
        },
        "worker": component,
        "watcher": component,
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


def chat_through_gateway(stack: LocalStack, namespace: str, content: str) -> None:
    """A chat request for `chat` through the chart's gateway pod is answered, with an
    API key a ModelAccessKey of the namespace holds the hash of (the chart's default
    `gateway.auth.mode: apikey`)."""
    gateway_ip = pod_of(stack, namespace, "gateway")["status"]["podIP"]
    name = f"chat-{secrets.token_hex(3)}"
    key = minted_key(namespace=namespace, name=name, secret=secrets.token_urlsafe(32))
    apply(stack, {
        "apiVersion": "kama.dev/v1alpha1",
        "kind": "ModelAccessKey",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"keySHA256": hashlib.sha256(key.encode()).hexdigest()},
    })  # fmt: skip

    def post() -> httpx.Response | None:
        reply = httpx.post(
            f"http://{gateway_ip}:8000/v1/chat/completions",
            json={
                "model": f"{namespace}/chat",
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 8,
                "temperature": 0,
            },
            headers={"authorization": f"Bearer {key}"},
            timeout=180,
        )
        return None if reply.status_code == 401 else reply  # the key's watch event is due

    reply = eventually(post, timeout=30, what="the gateway to know the new key", interval=0.5)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] is not None


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
    assert not can_i(stack, namespace, "gateway", "list", "pods", **outside)
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
    chat_through_gateway(stack, namespace, "hi")
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

    # `helm upgrade` with a changed worker value while an import and a rollout run
    started = time.monotonic()
    big = upgrade_mid_flight(stack, hub, namespace, tmp_path)
    mid_flight_s = time.monotonic() - started
    patch_chat(stack, namespace, {"scaling": {"minReplicas": 0}})
    eventually(back_to_zero, timeout=120, what="chat idle back to zero again", interval=0.5)

    # the upgrade-and-rollback runbook, as written: an upgrade that changes a value
    # rolls the worker and keeps every artifact Ready; the rollback restores the value
    started = time.monotonic()
    upgrade_and_roll_back(stack, namespace, temporal_address=f"{temporal_ip}:7233")
    runbook_s = time.monotonic() - started

    # uninstall: Kama's processes go, the CRDs, every Kama resource and the bytes stay;
    # a second install adopts them
    started = time.monotonic()
    reinstall_adopts(
        stack, hub, namespace, values_file,
        models={"chart-model": (repo, "model.gguf", model), "big": (big[0], "big.gguf", big[1])},
    )  # fmt: skip
    print(
        f"\nchart: installed and upgraded in {installed_s:.1f} s; worker rolled mid-flight "
        f"in {mid_flight_s:.1f} s; upgraded and rolled back by the runbook in "
        f"{runbook_s:.1f} s; uninstalled and reinstalled in "
        f"{time.monotonic() - started:.1f} s"
    )


# --- an upgrade mid-flight, and a reinstall ----------------------------------------------


def patch_chat(stack: LocalStack, namespace: str, spec: dict[str, Any]) -> None:
    """A user's change to the `chat` deployment's spec. The test's own certificate is
    the host Kama's, which the fence keeps off Kama resources, so the change is made
    as another cluster admin (impersonated), as a person would make it."""
    kubectl(stack, "patch", "modeldeployment", "chat", "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": spec}),
            "--as=test-chart-user", "--as-group=system:masters")  # fmt: skip


def cache_path(stack: LocalStack, namespace: str) -> Path:
    """The host directory of the `models` cache's volume (a hostPath PV on the stack)."""
    volume = get_json(stack, "pvc", "kama-cache-models", "-n", namespace)["spec"]["volumeName"]
    return Path(get_json(stack, "pv", volume)["spec"]["hostPath"]["path"])


def staged_bytes(stack: LocalStack, namespace: str, uid: str) -> int:
    """Bytes of the artifact's partial downloads (`.kama/staging/artifact-<uid>`)."""
    staging = cache_path(stack, namespace) / ".kama" / "staging" / f"artifact-{uid}"
    return sum(p.stat().st_size for p in staging.rglob("*.gguf")) if staging.exists() else 0


def artifact(stack: LocalStack, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = get_json(stack, "modelartifact", name, "-n", namespace)
    return obj


def is_ready(obj: dict[str, Any]) -> bool:
    found = condition(obj, "Ready")
    return bool(found and found["status"] == "True")


def serving_pods(stack: LocalStack, namespace: str, name: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = get_json(
        stack, "pods", "-n", namespace, "-l", f"kama.dev/deployment={name}"
    )["items"]
    return pods


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


def fingerprint(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["labels"]["kama.dev/fingerprint"])


def converged(stack: LocalStack, namespace: str, name: str) -> dict[str, Any] | None:
    """The deployment when its one replica is ready, of the current template, alone."""
    obj = md_status(stack, namespace, name)
    status = obj.get("status", {})
    pods = serving_pods(stack, namespace, name)
    ok = (
        len(pods) == 1
        and fingerprint(pods[0]) == status.get("fingerprint")
        and pod_ready(pods[0])
        and not pods[0]["metadata"].get("deletionTimestamp")
        and status.get("readyReplicas") == 1
        and (condition(obj, "Ready") or {}).get("reason") == "AllReplicasReady"
    )
    return obj if ok else None


def served_exactly_once(hub: HubFixture, repo: str, path: str, size: int) -> None:
    """Every byte of the file went to Kama once: the ranges the Hub served tile [0, size)
    without overlap (a resumed download would count only if it refetched nothing)."""
    served = sorted(hub.served_ranges(repo, path), key=lambda r: (r.start, r.end))
    tiles = [(r.start, r.end) for r in served]
    assert tiles and tiles[0][0] == 0 and tiles[-1][1] == size, f"{repo}/{path}: {tiles}"
    assert all(a[1] == b[0] for a, b in itertools.pairwise(tiles)), (
        f"{repo}/{path}: bytes served twice or missing: {tiles}"
    )


@contextlib.contextmanager
def pod_status_fence(
    stack: LocalStack, namespace: str, deployment: str, keep: str
) -> Iterator[None]:
    """Hold `deployment`'s pods of any template but `keep` unready: the API server
    refuses the kubelets' status reports for them (as a replica whose model takes long
    to load), so a rollout stays in flight for as long as the test needs. Lifted on
    exit; the kubelet reports again and the pod becomes ready."""
    held = (
        "request.subResource == 'status' && has(object.metadata.labels) && "
        "'kama.dev/deployment' in object.metadata.labels && "
        f"object.metadata.labels['kama.dev/deployment'] == '{deployment}' && "
        "'kama.dev/fingerprint' in object.metadata.labels && "
        f"object.metadata.labels['kama.dev/fingerprint'] != '{keep}'"
    )
    rules = [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["pods/status"],
        }
    ]
    with admission_fence(
        stack, namespace, name=f"kama-status-fence-{namespace}", rules=rules, refuse=held,
        message="held unready by test_chart",
        who="request.userInfo.username.startsWith('system:node:')",
    ):  # fmt: skip
        yield


def upgrade_mid_flight(
    stack: LocalStack, hub: HubFixture, namespace: str, tmp_path: Path
) -> tuple[str, Path]:
    """`helm upgrade --reuse-values` with a changed worker pod annotation replaces the
    worker pod while an import (the Hub held slow) and a rollout (the new replica held
    unready) are in flight; both finish afterwards, and the Hub served every byte once.
    Returns the slow model's repo and file."""
    # the rollout's starting point: chat at one ready replica
    patch_chat(stack, namespace, {"scaling": {"minReplicas": 1}})
    before = eventually(
        lambda: converged(stack, namespace, "chat"), timeout=180, what="chat at 1/1", interval=0.5
    )
    old_fp = before["status"]["fingerprint"]

    # an import the Hub serves at 64 KiB/s until released
    big_repo = f"acme/chart-big-{uuid.uuid4().hex[:6]}"
    big_model = write_model(
        tmp_path / "big.gguf", shape=ModelShape(n_layer=4, n_embd=256, n_ff=512, seed=92)
    )
    size = big_model.stat().st_size
    hub.add_repo(big_repo, {"big.gguf": big_model})
    throttle = Fault(bytes_per_second=64 * 1024, times=1000)
    hub.inject(big_repo, "big.gguf", throttle)
    apply(stack, hf_artifact(namespace, "big", big_repo, ["big.gguf"]))
    uid = artifact(stack, namespace, "big")["metadata"]["uid"]
    try:
        eventually(
            lambda: staged_bytes(stack, namespace, uid) > 0,
            timeout=120,
            what="big's download under way",
            interval=0.5,
        )
        old_worker = pod_of(stack, namespace, "worker")["metadata"]["name"]
        with pod_status_fence(stack, namespace, "chat", keep=old_fp):
            # a template change: the rollout creates a replica of the new template
            patch_chat(stack, namespace, {"runtime": {"contextSize": 1536}})
            eventually(
                lambda: [p for p in serving_pods(stack, namespace, "chat")
                         if fingerprint(p) != old_fp],
                timeout=60, what="the rollout's new replica", interval=0.5,
            )  # fmt: skip
            mark = uuid.uuid4().hex[:8]
            helm(stack, "upgrade", RELEASE, str(CHART), "-n", namespace, "--reuse-values",
                 "--set-string", f"worker.podAnnotations.rolled={mark}",
                 "--wait", "--timeout", "3m")  # fmt: skip

            def old_worker_gone() -> bool:
                names = kubectl(
                    stack, "get", "pods", "-n", namespace, "-o", "name",
                    "-l", "app.kubernetes.io/component=worker",
                ).stdout.split()  # fmt: skip
                return f"pod/{old_worker}" not in names

            eventually(old_worker_gone, timeout=120, what="the old worker pod gone", interval=0.5)
            worker = pod_of(stack, namespace, "worker")
            assert worker["metadata"]["name"] != old_worker
            assert worker["metadata"]["annotations"]["rolled"] == mark
            # both were still in flight when the old worker left
            assert not is_ready(artifact(stack, namespace, "big"))
            assert 0 < staged_bytes(stack, namespace, uid) < size
            pods = serving_pods(stack, namespace, "chat")
            assert old_fp in {fingerprint(p) for p in pods}, "the old replica still serves"
            assert not any(pod_ready(p) for p in pods if fingerprint(p) != old_fp)
    finally:
        throttle.bytes_per_second = None  # the rest at full speed
    rolled = eventually(
        lambda: converged(stack, namespace, "chat"),
        timeout=180,
        what="the rollout finished on the new worker",
        interval=0.5,
    )
    assert rolled["status"]["fingerprint"] != old_fp
    args = serving_pods(stack, namespace, "chat")[0]["metadata"]["annotations"]
    assert "--ctx-size 1536" in args["kama.dev/llama-server-args"]
    big = eventually(
        lambda: (lambda obj: obj if is_ready(obj) else None)(artifact(stack, namespace, "big")),
        timeout=180,
        what="big Ready",
        interval=0.5,
    )
    assert big["status"]["files"] == [
        {"path": "big.gguf", "size": size, "sha256": sha256_file(big_model)}
    ]
    served_exactly_once(hub, big_repo, "big.gguf", size)
    return big_repo, big_model


def upgrade_and_roll_back(stack: LocalStack, namespace: str, *, temporal_address: str) -> None:
    """docs/runbooks/upgrade-and-rollback.md's blocks against this release."""
    before = pod_of(stack, namespace, "worker")["metadata"]["annotations"]
    mark = uuid.uuid4().hex[:8]
    env = {"RELEASE": RELEASE, "NS": namespace, "SERVED_NS": namespace, "CHART": str(CHART)}
    flags = f"--set-string worker.podAnnotations.upgraded={mark}"
    said = run_runbook(
        stack, RUNBOOKS["upgrade"], "upgrade", {**env, "UPGRADE_FLAGS": flags},
        temporal_address=temporal_address,
    )  # fmt: skip
    assert "chart-model" in said and "condition met" in said, said
    upgraded = pod_of(stack, namespace, "worker")["metadata"]["annotations"]
    assert upgraded.get("upgraded") == mark, "the upgrade rolled the worker"

    said = run_runbook(
        stack, RUNBOOKS["upgrade"], "rollback", env, temporal_address=temporal_address
    )
    assert '"status":"deployed"' in said and "Rollback to" in said, said

    def rolled_back() -> dict[str, Any] | None:
        annotations: dict[str, Any] = pod_of(stack, namespace, "worker")["metadata"]["annotations"]
        return annotations if "upgraded" not in annotations else None

    restored = eventually(rolled_back, timeout=120, what="the rolled-back worker", interval=0.5)
    assert restored.get("rolled") == before.get("rolled"), "the earlier values are back"


def workflow_execution(stack: LocalStack, address: str, workflow_id: str) -> tuple[str, str]:
    """(run ID, status) of the workflow's latest run on the Temporal at `address`."""
    described = subprocess.run(
        [str(stack.binaries.temporal), "workflow", "describe", "--address", address,
         "--workflow-id", workflow_id, "--output", "json"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert described.returncode == 0, f"{workflow_id}: {described.stderr}"
    info = json.loads(described.stdout)
    execution = info.get("workflowExecutionInfo") or info.get("executionInfo") or {}
    return str(execution["execution"]["runId"]), str(execution["status"])


def reinstall_adopts(
    stack: LocalStack,
    hub: HubFixture,
    namespace: str,
    values_file: Path,
    *,
    models: dict[str, tuple[str, str, Path]],
) -> None:
    """`helm uninstall` leaves the CRDs, every Kama resource, the artifacts Ready and
    their bytes; `helm install` of the same release adopts them: the same workflows keep
    them, nothing is downloaded again, and the deployment serves again (from zero)."""
    resources = [("modelcache", "models"), ("modeldeployment", "chat")] + [
        ("modelartifact", name) for name in models
    ]
    temporal = f"{pod_of(stack, namespace, 'temporal')['status']['podIP']}:7233"
    workflow_ids = {
        ref: get_json(stack, ref[0], ref[1], "-n", namespace)["status"]["workflowID"]
        for ref in resources
    }
    runs = {ref: workflow_execution(stack, temporal, wid) for ref, wid in workflow_ids.items()}
    assert all(status.endswith("RUNNING") for _, status in runs.values()), runs
    repos = {repo for repo, _, _ in models.values()}
    hub_calls = [r for r in hub.log.requests if any(repo in r[1] for repo in repos)]

    # the artifacts stay Ready from here to the end, whoever runs Kama
    seen: list[tuple[str, str]] = []
    stop = threading.Event()

    def watch_ready() -> None:
        while not stop.wait(1.0):
            for name in models:
                found = condition(artifact(stack, namespace, name), "Ready") or {}
                seen.append((name, str(found.get("status"))))

    watcher = threading.Thread(target=watch_ready, daemon=True)
    watcher.start()
    try:
        helm(stack, "uninstall", RELEASE, "-n", namespace, "--wait", "--timeout", "2m")
        assert helm(stack, "list", "-n", namespace, "-q").stdout.strip() == ""
        for crd_name in ("modelartifacts", "modelcaches", "modeldeployments"):
            kubectl(stack, "get", "crd", f"{crd_name}.kama.dev")
        for kind, name in resources:
            kubectl(stack, "get", kind, name, "-n", namespace)
        assert not get_json(stack, "deployments", "-n", namespace)["items"]

        def kama_pods_gone() -> bool:
            # the Deployments went with `--wait`; their pods end gracefully after (the
            # gateway's preStop and drain), deleted by the garbage collector
            pods = get_json(stack, "pods", "-n", namespace, "-l", "app.kubernetes.io/name=kama")
            return not pods["items"]

        eventually(kama_pods_gone, timeout=120, what="Kama's pods gone after uninstall")
        root = cache_path(stack, namespace)
        for name, (_, _, model) in models.items():
            status = artifact(stack, namespace, name)["status"]
            published = root / status["servingLocation"]["subPath"]
            assert (published / "READY").exists(), f"{name}: bytes gone with the release"
            (entry,) = status["files"]
            assert sha256_file(published / entry["path"]) == entry["sha256"] == sha256_file(model)

        # the same release again, the same two steps as the first install
        helm(stack, "install", RELEASE, str(CHART), "-n", namespace, "-f", str(values_file),
             "--wait", "--timeout", "3m")  # fmt: skip
        temporal = f"{pod_of(stack, namespace, 'temporal')['status']['podIP']}:7233"
        helm(stack, "upgrade", RELEASE, str(CHART), "-n", namespace, "--reuse-values",
             "--set", f"temporal.address={temporal}",
             "--set", "worker.replicas=1", "--set", "watcher.replicas=1",
             "--set", "gateway.replicas=1", "--wait", "--timeout", "3m")  # fmt: skip
        assert condition(md_status(stack, namespace, "chat"), "ScaledToZero")
        chat_through_gateway(stack, namespace, "hi again")
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert seen and all(status == "True" for _, status in seen), (
        f"an artifact left Ready: {[s for s in seen if s[1] != 'True'][:5]}"
    )

    # the same workflows: IDs from the resources' uids, running on the reinstalled Kama's
    # Temporal; the artifacts' entity workflows continue the very same runs
    for ref, wid in workflow_ids.items():
        assert get_json(stack, ref[0], ref[1], "-n", namespace)["status"]["workflowID"] == wid
        run_id, status = workflow_execution(stack, temporal, wid)
        assert status.endswith("RUNNING"), f"{wid}: {status}"
        if ref[0] == "modelartifact":
            assert run_id == runs[ref][0], f"{wid}: a new run {run_id}, was {runs[ref][0]}"
    # nothing fetched from the Hub again, not even metadata
    assert [r for r in hub.log.requests if any(repo in r[1] for repo in repos)] == hub_calls
    for repo, path, model in models.values():
        served_exactly_once(hub, repo, path, model.stat().st_size)

    def idle() -> bool:
        return md_status(stack, namespace, "chat")["spec"].get("replicas") == 0 and not (
            serving_pods(stack, namespace, "chat")
        )

    eventually(idle, timeout=120, what="chat idle back to zero after the reinstall", interval=0.5)
