"""The artifact plane end to end on the local stack: `kubectl apply` of a cache and a
Hugging Face artifact → the watcher starts the entity workflow, an importer pod
downloads next to the cache volume, and the artifact becomes Ready with the right
commit, digests, facts and progress; bad bytes, missing sources and deletion behave."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kamadev.demo import claim_host_path, claim_manifest
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.hub import Fault
from tests.conftest import KamaControl
from tests.support import apply, events_about, eventually, get_json, kubectl, wait_gone

READY_TIMEOUT = 120


def cache(namespace: str, name: str = "models") -> dict[str, Any]:
    return {
        "apiVersion": "kama.dev/v1alpha1",
        "kind": "ModelCache",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"claimTemplate": {"size": "2Gi", "accessModes": ["ReadWriteOnce"]}},
    }


def hf_artifact(
    namespace: str, name: str, repo: str, files: list[str], **extra: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "kama.dev/v1alpha1",
        "kind": "ModelArtifact",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "source": {"huggingFace": {"repo": repo, "revision": "main", "files": files, **extra}},
            "cacheRef": {"name": "models"},
        },
    }


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def wait_condition(
    control: KamaControl, namespace: str, name: str, kind: str, status: str = "True"
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        control.worker.check_alive()
        control.watcher.check_alive()
        obj = get_json(control.stack, "modelartifact", name, "-n", namespace)
        found = condition(obj, kind)
        return obj if found and found["status"] == status else None

    return eventually(check, timeout=READY_TIMEOUT, what=f"{name} {kind}={status}", interval=0.5)


def cache_dir(control: KamaControl, namespace: str) -> Path:
    volume = get_json(control.stack, "pvc", "kama-cache-models", "-n", namespace)["spec"][
        "volumeName"
    ]
    return Path(get_json(control.stack, "pv", volume)["spec"]["hostPath"]["path"])


def publish_model(control: KamaControl, tmp_path: Path, *, seed: int = 0) -> tuple[str, Path, str]:
    repo = f"acme/tiny-{uuid.uuid4().hex[:6]}"
    model = write_model(
        tmp_path / f"tiny-{seed}.gguf", shape=ModelShape(n_layer=2, n_head_kv=2, seed=seed)
    )
    commit = control.hub.add_repo(repo, {"tiny.gguf": model})
    return repo, model, commit


def test_hugging_face_artifact_becomes_ready(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    repo, model, commit = publish_model(control, tmp_path)
    apply(control.stack, cache(namespace), hf_artifact(namespace, "tiny", repo, ["tiny.gguf"]))
    obj = wait_condition(control, namespace, "tiny", "Ready")
    status = obj["status"]
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    assert status["phase"] == "Ready" and status["resolvedCommit"] == commit
    assert status["files"] == [{"path": "tiny.gguf", "size": model.stat().st_size, "sha256": sha}]
    assert status["artifactDigest"] == f"sha256:{sha}" and status["shortDigest"] == sha[:12]
    assert status["totalSize"] == model.stat().st_size
    assert status["progress"] == {
        "bytesDone": model.stat().st_size,
        "bytesTotal": model.stat().st_size,
    }
    assert status["gguf"]["architecture"] == "llama" and status["gguf"]["layers"] == 2
    assert status["gguf"]["headCountKV"] == 2
    assert condition(obj, "Verified")["status"] == "True"  # type: ignore[index]
    assert "kama.dev/finalizer" in obj["metadata"]["finalizers"]

    digest = status["manifestDigest"].removeprefix("sha256:")
    location = status["servingLocation"]
    assert (
        location["claimName"] == "kama-cache-models"
        and location["subPath"] == f"blobs/sha256/{digest}"
    )
    published = cache_dir(control, namespace) / location["subPath"]
    assert (published / "READY").exists() and (
        published / "tiny.gguf"
    ).read_bytes() == model.read_bytes()

    table = kubectl(control.stack, "get", "modelartifacts", "-n", namespace).stdout
    row = next(line.split() for line in table.splitlines() if line.startswith("tiny"))
    assert row[1:5] == ["True", "Ready", str(model.stat().st_size), sha[:12]]

    listed = subprocess.run(
        [
            str(control.stack.binaries.temporal),
            "workflow",
            "list",
            "--address",
            control.stack.temporal.address,
            "--query",
            "KamaName='tiny' AND KamaKind='ModelArtifact'",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ids = {row["execution"]["workflowId"] for row in json.loads(listed)}
    entity = [i for i in ids if i.startswith(f"artifact/{namespace}/tiny/")]
    assert len(entity) == 1, f"two watchers, one entity workflow: {ids}"
    assert any(i.startswith(f"import/{namespace}/tiny/") for i in ids), (
        "the import child is found by KamaName too"
    )

    # importer pods are gone once the import is done
    pods = kubectl(
        control.stack, "get", "pods", "-n", namespace, "-l", "kama.dev/role=importer", "-o", "name"
    ).stdout
    eventually(
        lambda: (
            kubectl(
                control.stack,
                "get",
                "pods",
                "-n",
                namespace,
                "-l",
                "kama.dev/role=importer",
                "-o",
                "name",
            ).stdout.strip()
            == ""
        ),
        timeout=60,
        what=f"importer pods deleted (were {pods!r})",
    )

    kubectl(control.stack, "delete", "modelartifact", "tiny", "-n", namespace, "--timeout=60s")
    assert (published / "READY").exists(), "deleting the artifact keeps the bytes (Retain)"


def test_same_source_is_downloaded_once(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    repo, model, _ = publish_model(control, tmp_path, seed=3)
    apply(control.stack, cache(namespace), hf_artifact(namespace, "first", repo, ["tiny.gguf"]))
    first = wait_condition(control, namespace, "first", "Ready")
    apply(control.stack, hf_artifact(namespace, "second", repo, ["tiny.gguf"]))
    second = wait_condition(control, namespace, "second", "Ready")
    assert first["status"]["manifestDigest"] == second["status"]["manifestDigest"]
    served = control.hub.served_ranges(repo, "tiny.gguf")
    assert sum(r.end - r.start for r in served) == model.stat().st_size, (
        "one download for both artifacts"
    )
    assert "reused" in condition(second, "Importing")["message"]  # type: ignore[index]


def test_wrong_bytes_are_never_ready(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    repo, _, _ = publish_model(control, tmp_path, seed=5)
    control.hub.inject(repo, "tiny.gguf", Fault(corrupt=True))
    apply(control.stack, cache(namespace), hf_artifact(namespace, "bad", repo, ["tiny.gguf"]))
    obj = wait_condition(control, namespace, "bad", "ChecksumMismatch")
    assert obj["status"]["phase"] == "Failed"
    assert condition(obj, "Ready")["status"] == "False"  # type: ignore[index]
    blobs = cache_dir(control, namespace) / "blobs" / "sha256"
    assert not blobs.exists() or not any(blobs.iterdir()), "nothing is published"
    events = events_about(control.stack, namespace, "bad")
    assert "ChecksumMismatch" in events


def test_missing_repo_is_source_unavailable_without_retry_storm(
    kama_control: KamaControl, namespace: str
) -> None:
    control = kama_control
    repo = f"acme/missing-{uuid.uuid4().hex[:6]}"
    apply(control.stack, cache(namespace), hf_artifact(namespace, "ghost", repo, ["m.gguf"]))
    obj = wait_condition(control, namespace, "ghost", "SourceUnavailable")
    assert repo in condition(obj, "SourceUnavailable")["message"]  # type: ignore[index]
    calls = [r for r in control.hub.log.requests if r[1].startswith(f"/api/models/{repo}")]
    assert len(calls) == 1


def log_texts(root: Path) -> Iterator[str]:
    """Every log file's text under `root`, as it is now: a pod removed meanwhile (the
    importer's, once its import is done) takes its logs with it, and a container's
    directory may go while it is walked (`os.walk` skips a directory it cannot list,
    where `Path.rglob` raises)."""
    for directory, _, files in os.walk(root):
        for name in files:
            if name.endswith(".log"):
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    yield (Path(directory) / name).read_text(errors="replace")


def test_token_is_used_but_never_shown(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    token = f"hf_{uuid.uuid4().hex}"
    repo = f"acme/private-{uuid.uuid4().hex[:6]}"
    model = write_model(tmp_path / "p.gguf", shape=ModelShape(seed=9))
    control.hub.add_repo(repo, {"p.gguf": model}, token=token)
    kubectl(
        control.stack,
        "create",
        "secret",
        "generic",
        "hf",
        "-n",
        namespace,
        f"--from-literal=token={token}",
    )
    apply(
        control.stack,
        cache(namespace),
        hf_artifact(
            namespace, "private", repo, ["p.gguf"], tokenSecretRef={"name": "hf", "key": "token"}
        ),
    )
    obj = wait_condition(control, namespace, "private", "Ready")
    assert token not in json.dumps(obj)
    events = kubectl(control.stack, "get", "events", "-n", namespace, "-o", "json").stdout
    assert token not in events
    logs = list(log_texts(control.stack.workdir))
    assert logs and all(token not in text for text in logs)


def staged_bytes(control: KamaControl, namespace: str) -> int:
    try:
        staging = cache_dir(control, namespace) / ".kama" / "staging"
    except (KeyError, AssertionError):
        return 0
    return sum(p.stat().st_size for p in staging.rglob("*.gguf")) if staging.exists() else 0


def slow_model(control: KamaControl, tmp_path: Path, *, seed: int) -> tuple[str, Path]:
    repo = f"acme/big-{uuid.uuid4().hex[:6]}"
    model = write_model(
        tmp_path / f"big-{seed}.gguf", shape=ModelShape(n_layer=4, n_embd=256, n_ff=512, seed=seed)
    )
    control.hub.add_repo(repo, {"big.gguf": model})
    control.hub.inject(repo, "big.gguf", Fault(bytes_per_second=2 * 1024 * 1024, times=10))
    return repo, model


def test_killed_importer_pod_resumes_without_refetching(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    repo, model = slow_model(control, tmp_path, seed=11)
    apply(control.stack, cache(namespace), hf_artifact(namespace, "big", repo, ["big.gguf"]))
    eventually(
        lambda: staged_bytes(control, namespace) > 2 * 1024 * 1024,
        timeout=60,
        what="the download to be under way",
    )
    pods = kubectl(
        control.stack, "get", "pods", "-n", namespace, "-l", "kama.dev/role=importer", "-o", "name"
    ).stdout.split()
    assert len(pods) == 1
    kubectl(control.stack, "delete", "-n", namespace, pods[0], "--grace-period=0", "--force")
    obj = wait_condition(control, namespace, "big", "Ready")
    assert obj["status"]["files"][0]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    served = sorted(control.hub.served_ranges(repo, "big.gguf"), key=lambda r: r.start)
    assert len(served) >= 2, "the import resumed with a Range request"
    assert served[1].start >= 2 * 1024 * 1024, "the resume kept the bytes already on disk"
    # what a kill -9 may lose: the hub counts a 256 KiB chunk as sent once the kernel
    # takes it, and the pod held a socket buffer and the writer's queue not yet on
    # disk; a restart from zero would fetch more than 2 MiB again
    refetched = sum(max(0, prev.end - cur.start) for prev, cur in itertools.pairwise(served))
    assert refetched <= 1024 * 1024, f"bytes fetched twice: {refetched}"
    assert served[-1].end == model.stat().st_size


def test_import_finishes_after_worker_restart(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    repo, model = slow_model(control, tmp_path, seed=12)
    apply(control.stack, cache(namespace), hf_artifact(namespace, "durable", repo, ["big.gguf"]))
    eventually(
        lambda: staged_bytes(control, namespace) > 1024 * 1024,
        timeout=60,
        what="the download to be under way",
    )
    control.kill_worker()
    try:
        eventually(
            lambda: staged_bytes(control, namespace) >= model.stat().st_size or None,
            timeout=60,
            what="the importer to keep downloading",
        )
    finally:
        control.restart_worker()
    obj = wait_condition(control, namespace, "durable", "Ready")
    assert obj["status"]["totalSize"] == model.stat().st_size


def pvc_artifact(namespace: str, name: str, path: str, mode: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "source": {"persistentVolumeClaim": {"claimName": "uploads", "path": path, "mode": mode}}
    }
    if mode == "Copy":
        spec["cacheRef"] = {"name": "models"}
    return {
        "apiVersion": "kama.dev/v1alpha1",
        "kind": "ModelArtifact",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def test_pvc_copy_and_direct_sources(kama_control: KamaControl, namespace: str) -> None:
    control = kama_control
    apply(
        control.stack,
        cache(namespace),
        claim_manifest(name="uploads", namespace=namespace),
    )
    root = claim_host_path(core=control.stack.core(), name="uploads", namespace=namespace)
    (root / "models").mkdir()
    model = write_model(root / "models" / "tiny.gguf", shape=ModelShape(seed=21))
    (root / "escape.gguf").symlink_to("/etc/hostname")
    os.mkfifo(root / "pipe.gguf")
    apply(
        control.stack,
        pvc_artifact(namespace, "copied", "models/tiny.gguf", "Copy"),
        pvc_artifact(namespace, "in-place", "models/tiny.gguf", "Direct"),
        pvc_artifact(namespace, "escape", "escape.gguf", "Direct"),
        pvc_artifact(namespace, "pipe", "pipe.gguf", "Direct"),
    )
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    copied = wait_condition(control, namespace, "copied", "Ready")["status"]
    assert (
        copied["files"][0]["sha256"] == sha
        and copied["servingLocation"]["claimName"] == "kama-cache-models"
    )
    assert (
        cache_dir(control, namespace) / copied["servingLocation"]["subPath"] / "tiny.gguf"
    ).read_bytes() == model.read_bytes()
    direct = wait_condition(control, namespace, "in-place", "Ready")["status"]
    location = direct["servingLocation"]
    assert {k: location[k] for k in ("claimName", "subPath", "accessModes")} == {
        "claimName": "uploads",
        "subPath": "models",
        "accessModes": ["ReadWriteOnce"],
    }
    # the local volume's node, from its PersistentVolume: replicas must land there
    (term,) = location["nodeAffinity"]["required"]["nodeSelectorTerms"]
    (expression,) = term["matchExpressions"]
    nodes = kubectl(control.stack, "get", "nodes", "-o", "name").stdout
    assert expression["key"] == "kubernetes.io/hostname" and expression["values"][0] in nodes
    assert direct["artifactDigest"] == f"sha256:{sha}" and direct["gguf"]["architecture"] == "llama"
    escape = wait_condition(control, namespace, "escape", "SourceUnavailable")
    assert "outside the source claim" in condition(escape, "SourceUnavailable")["message"]  # type: ignore[index]
    pipe = wait_condition(control, namespace, "pipe", "SourceUnavailable")
    assert "not a regular file" in condition(pipe, "SourceUnavailable")["message"]  # type: ignore[index]


def test_cache_reports_storage_and_deletes_only_its_own_claim(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    repo, _, _ = publish_model(control, tmp_path, seed=31)
    owned = cache(namespace)
    owned["spec"]["retentionPolicy"] = "Delete"
    apply(control.stack, owned, hf_artifact(namespace, "user", repo, ["tiny.gguf"]))

    def cache_ready() -> dict[str, Any] | None:
        obj = get_json(control.stack, "modelcache", "models", "-n", namespace)
        found = condition(obj, "Ready")
        return obj if found and found["status"] == "True" else None

    status = eventually(cache_ready, timeout=READY_TIMEOUT, what="cache Ready")["status"]
    assert status["claimName"] == "kama-cache-models" and status["capacity"] == "2Gi"
    assert status["accessModes"] == ["ReadWriteOnce"]
    wait_condition(control, namespace, "user", "Ready")
    reported = eventually(
        lambda: get_json(control.stack, "modelcache", "models", "-n", namespace)["status"].get(
            "freeBytes"
        ),
        timeout=30,
        what="free space reported by the importer",
    )
    assert reported > 0

    kubectl(control.stack, "delete", "modelcache", "models", "-n", namespace, "--wait=false")
    eventually(
        lambda: "DeletionBlocked" in events_about(control.stack, namespace, "models"),
        timeout=60,
        what="the cache deletion to be held while an artifact uses it",
    )
    assert get_json(control.stack, "pvc", "kama-cache-models", "-n", namespace)["metadata"]["name"]
    kubectl(control.stack, "delete", "modelartifact", "user", "-n", namespace, "--timeout=60s")
    wait_gone(
        control.stack,
        "modelcache",
        "models",
        namespace,
        timeout=90,
        what="the cache to be deleted once unused",
    )
    wait_gone(
        control.stack,
        "pvc",
        "kama-cache-models",
        namespace,
        timeout=60,
        what="the claim Kama created to be deleted (retentionPolicy Delete)",
    )

    # an existing claim is never deleted, whatever happens to the cache
    apply(
        control.stack,
        claim_manifest(name="precious", namespace=namespace),
        {
            "apiVersion": "kama.dev/v1alpha1",
            "kind": "ModelCache",
            "metadata": {"name": "borrowed", "namespace": namespace},
            "spec": {"persistentVolumeClaim": {"claimName": "precious"}},
        },
    )
    eventually(
        lambda: condition(
            get_json(control.stack, "modelcache", "borrowed", "-n", namespace), "Ready"
        ),
        timeout=READY_TIMEOUT,
        what="the borrowed cache to report",
    )
    kubectl(control.stack, "delete", "modelcache", "borrowed", "-n", namespace, "--timeout=60s")
    assert (
        get_json(control.stack, "pvc", "precious", "-n", namespace)["metadata"]["name"]
        == "precious"
    )


def test_artifact_deletion_waits_for_deployments_and_keeps_bytes(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    repo, model, _ = publish_model(control, tmp_path, seed=41)
    apply(
        control.stack,
        cache(namespace),
        hf_artifact(namespace, "served", repo, ["tiny.gguf"]),
        {
            "apiVersion": "kama.dev/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": "chat", "namespace": namespace},
            "spec": {"modelRef": {"name": "served"}},
        },
    )
    status = wait_condition(control, namespace, "served", "Ready")["status"]
    published = cache_dir(control, namespace) / status["servingLocation"]["subPath"]
    kubectl(control.stack, "delete", "modelartifact", "served", "-n", namespace, "--wait=false")
    eventually(
        lambda: "ModelDeployment(s) chat" in events_about(control.stack, namespace, "served"),
        timeout=60,
        what="the deletion to be held by the deployment",
    )
    assert get_json(control.stack, "modelartifact", "served", "-n", namespace)["metadata"][
        "deletionTimestamp"
    ]
    kubectl(control.stack, "delete", "modeldeployment", "chat", "-n", namespace)
    wait_gone(
        control.stack,
        "modelartifact",
        "served",
        namespace,
        timeout=90,
        what="the artifact to be deleted once unreferenced",
    )
    assert (published / "READY").exists() and (
        published / "tiny.gguf"
    ).stat().st_size == model.stat().st_size


# hardening (issue 12, item 13) ----------------------------------------------------------


def signal_artifact(control: KamaControl, namespace: str, name: str, signal: str) -> None:
    """What an operator runs: `temporal workflow signal --name <signal>` on the
    artifact's entity workflow."""
    uid = get_json(control.stack, "modelartifact", name, "-n", namespace)["metadata"]["uid"]
    subprocess.run(
        [
            str(control.stack.binaries.temporal),
            "workflow",
            "signal",
            "--address",
            control.stack.temporal.address,
            "--workflow-id",
            f"artifact/{namespace}/{name}/{uid}",
            "--name",
            signal,
        ],
        capture_output=True,
        text=True,
        check=True,
    )


def test_retry_resumes_the_partial_download(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    """A download cut off half way, then refused for good (a revoked token): the
    artifact fails; the `retry` once it is fixed fetches only the bytes still missing."""
    control = kama_control
    repo = f"acme/cut-{uuid.uuid4().hex[:6]}"
    model = write_model(
        tmp_path / "cut.gguf", shape=ModelShape(n_layer=4, n_embd=256, n_ff=512, seed=13)
    )
    control.hub.add_repo(repo, {"cut.gguf": model})
    half = model.stat().st_size // 2
    control.hub.inject(repo, "cut.gguf", Fault(truncate_at=half))
    control.hub.inject(repo, "cut.gguf", Fault(status=403))
    apply(control.stack, cache(namespace), hf_artifact(namespace, "cut", repo, ["cut.gguf"]))
    wait_condition(control, namespace, "cut", "SourceUnavailable")
    assert staged_bytes(control, namespace) == half, "the partial file is kept for a retry"

    signal_artifact(control, namespace, "cut", "retry")
    obj = wait_condition(control, namespace, "cut", "Ready")
    assert obj["status"]["files"][0]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    served = sorted(control.hub.served_ranges(repo, "cut.gguf"), key=lambda r: r.start)
    assert [(r.start, r.end) for r in served] == [(0, half), (half, model.stat().st_size)], (
        "the retry resumed: no byte fetched twice"
    )
    assert staged_bytes(control, namespace) == 0, "published: staging is empty"


def cache_condition(
    control: KamaControl, namespace: str, name: str, kind: str, reason: str, status: str = "True"
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        control.worker.check_alive()
        found = condition(get_json(control.stack, "modelcache", name, "-n", namespace), kind)
        return found if found and (found["status"], found["reason"]) == (status, reason) else None

    return eventually(check, timeout=READY_TIMEOUT, what=f"cache {name} {kind}={status} ({reason})")


def grow(control: KamaControl, namespace: str, name: str, size: str) -> None:
    patch = json.dumps({"spec": {"claimTemplate": {"size": size}}})
    kubectl(
        control.stack, "patch", "modelcache", name, "-n", namespace, "--type=merge", "-p", patch
    )


def claim_request(control: KamaControl, namespace: str, claim: str) -> str:
    pvc = get_json(control.stack, "pvc", claim, "-n", namespace)
    return str(pvc["spec"]["resources"]["requests"]["storage"])


def test_a_grown_claim_template_expands_the_claim_or_says_why_not(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    apply(control.stack, cache(namespace))  # the stack's default class: no expansion
    cache_condition(control, namespace, "models", "Ready", "ClaimBound")
    grow(control, namespace, "models", "3Gi")
    found = cache_condition(
        control, namespace, "models", "InsufficientCapacity", "ExpansionNotSupported"
    )
    assert "allowVolumeExpansion" in found["message"] and "3Gi" in found["message"]
    assert claim_request(control, namespace, "kama-cache-models") == "2Gi"

    # a class that allows expansion, and a volume bound to Kama's claim ahead of time
    storage_class = f"kama-grow-{namespace}"[:63]
    volume = f"kama-grow-{uuid.uuid4().hex[:8]}"
    (tmp_path / "volume").mkdir()
    apply(
        control.stack,
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": storage_class},
            "provisioner": "kubernetes.io/no-provisioner",
            "allowVolumeExpansion": True,
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": storage_class,
                "hostPath": {"path": str(tmp_path / "volume")},
                "claimRef": {"namespace": namespace, "name": "kama-cache-grow"},
            },
        },
    )
    try:
        grown = cache(namespace, "grow")
        grown["spec"]["claimTemplate"] = {"size": "1Gi", "storageClassName": storage_class}
        apply(control.stack, grown)
        cache_condition(control, namespace, "grow", "Ready", "ClaimBound")
        grow(control, namespace, "grow", "2Gi")
        found = cache_condition(control, namespace, "grow", "InsufficientCapacity", "Expanding")
        assert "from 1Gi to 2Gi" in found["message"]
        assert claim_request(control, namespace, "kama-cache-grow") == "2Gi"

        # what the volume's resizer does once the volume has grown
        resized = json.dumps({"status": {"capacity": {"storage": "2Gi"}}})
        kubectl(
            control.stack,
            "patch",
            "pvc",
            "kama-cache-grow",
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            resized,
        )
        cache_condition(control, namespace, "grow", "InsufficientCapacity", "Enough", "False")
        status = get_json(control.stack, "modelcache", "grow", "-n", namespace)["status"]
        assert status["capacity"] == "2Gi"
    finally:
        kubectl(control.stack, "delete", "modelcache", "grow", "-n", namespace, "--wait=false")
        kubectl(control.stack, "delete", "pvc", "kama-cache-grow", "-n", namespace, check=False)
        kubectl(control.stack, "delete", "pv", volume, "--wait=false", check=False)
        kubectl(control.stack, "delete", "storageclass", storage_class, check=False)


def test_verify_signal_rehashes_and_finds_corrupted_bytes(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    """`temporal workflow signal --name verify` re-hashes a Ready artifact next to the
    volume; a bit flipped in the cache afterwards makes it ChecksumMismatch, the blob
    is taken out of the published tree, and `retry` downloads it again."""
    control = kama_control
    repo, model, _ = publish_model(control, tmp_path, seed=17)
    apply(control.stack, cache(namespace), hf_artifact(namespace, "kept", repo, ["tiny.gguf"]))
    status = wait_condition(control, namespace, "kept", "Ready")["status"]
    signal_artifact(control, namespace, "kept", "verify")
    eventually(
        lambda: (
            (
                condition(
                    get_json(control.stack, "modelartifact", "kept", "-n", namespace), "Verified"
                )
                or {}
            ).get("reason")
            == "Rehashed"
        ),
        timeout=READY_TIMEOUT,
        what="Verified=True (Rehashed) after the verify signal",
    )
    published = cache_dir(control, namespace) / status["servingLocation"]["subPath"]
    data = bytearray((published / "tiny.gguf").read_bytes())
    data[-1] ^= 0xFF
    (published / "tiny.gguf").write_bytes(bytes(data))
    signal_artifact(control, namespace, "kept", "verify")
    obj = wait_condition(control, namespace, "kept", "ChecksumMismatch")
    assert condition(obj, "Ready")["status"] == "False"  # type: ignore[index]
    assert not published.exists(), "the corrupted blob left the published tree"
    signal_artifact(control, namespace, "kept", "retry")
    wait_condition(control, namespace, "kept", "Ready")
    assert (published / "tiny.gguf").read_bytes() == model.read_bytes()
    assert len(control.hub.served_ranges(repo, "tiny.gguf")) == 2, "downloaded again"


def test_a_cache_on_a_wait_for_first_consumer_class_starts_its_import(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    """A claim of a StorageClass that binds WaitForFirstConsumer (the default class on
    many clouds) stays Pending until a pod mounts it: Kama must start the importer pod
    rather than wait for Bound, which would never come (no provisioner serves this
    class here, so the pod then waits for its volume, Pending, as on a real cluster)."""
    control = kama_control
    storage_class = f"wffc-{uuid.uuid4().hex[:6]}"
    apply(
        control.stack,
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": storage_class},
            "provisioner": "example.com/nobody",
            "volumeBindingMode": "WaitForFirstConsumer",
        },
    )
    pool = cache(namespace)
    pool["spec"]["claimTemplate"]["storageClassName"] = storage_class
    repo = f"acme/wffc-{uuid.uuid4().hex[:6]}"
    model = write_model(tmp_path / "wffc.gguf", shape=ModelShape(seed=61))
    control.hub.add_repo(repo, {"model.gguf": model})
    apply(control.stack, pool, hf_artifact(namespace, "wffc", repo, ["model.gguf"]))

    def importer_pods() -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = get_json(control.stack, "pods", "-n", namespace)["items"]
        return [p for p in pods if p["metadata"]["name"].startswith("wffc-import-")]

    eventually(importer_pods, timeout=60, what="an importer pod for the Pending claim")
    claim = get_json(control.stack, "pvc", "kama-cache-models", "-n", namespace)
    assert claim["status"]["phase"] == "Pending"
    kubectl(control.stack, "delete", "storageclass", storage_class)
