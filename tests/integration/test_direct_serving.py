"""A Direct artifact served end to end on the local stack (issue 12, item 14): a model
file someone put on their own claim becomes a ModelArtifact in Direct mode (verified in
place, never copied), a ModelDeployment serves it, and a chat completion answers.

The serving pod mounts the file's directory at /models (`servingLocation.subPath`),
so llama-server is given /models/tiny.gguf; the claim holds no manifest and no READY,
so the runtime supervisor hashes the files again and starts llama-server only if they
make the manifest digest recorded at import. A file changed on the claim afterwards
is refused by a new replica, and found by the `verify` signal."""

from __future__ import annotations

import hashlib
from typing import Any

from kama.serving_plan import ARTIFACT_LAYOUT_ENV, IN_PLACE_LAYOUT, ServingPlan
from kama.serving_pod import ARGS_ANNOTATION, ServingTemplate, serving_pod_manifest
from kamadev.demo import claim_host_path, claim_manifest
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.stack import KAMA_IMAGE
from tests.conftest import KamaControl
from tests.integration.test_artifact_plane import (
    condition,
    pvc_artifact,
    signal_artifact,
    wait_condition,
)
from tests.integration.test_serving_plane import chat, deployment, serving_pods, wait_ready
from tests.support import apply, eventually, get_json, kubectl


def runtime_pod(
    namespace: str, name: str, *, plan: ServingPlan, claim: str, sub_path: str
) -> dict[str, Any]:
    """Kama's serving pod for `plan`, under a plain name and without an owner."""
    template = ServingTemplate(
        image=KAMA_IMAGE,
        plan=plan,
        claim_name=claim,
        sub_path=sub_path,
        cpu_request="100m",
        memory_request="64Mi",
    )
    pod = serving_pod_manifest(
        template=template, namespace=namespace, deployment="none", deployment_uid="", ordinal=0
    )
    pod["metadata"] = {"name": name, "namespace": namespace}
    return pod


def why_not_serving(control: KamaControl, namespace: str, name: str) -> str:
    """The deployment's conditions and its pods' logs, for a failure message."""
    status = get_json(control.stack, "modeldeployment", name, "-n", namespace).get("status", {})
    lines = [
        f"{c['type']}={c['status']} {c['reason']}: {c['message']}"
        for c in status.get("conditions", [])
    ]
    for pod in serving_pods(control, namespace, name):
        pod_name = pod["metadata"]["name"]
        logs = kubectl(control.stack, "logs", pod_name, "-n", namespace, check=False)
        lines.append(f"--- {pod_name} {pod.get('status', {}).get('phase')}:\n{logs.stdout[-2000:]}")
    return "\n".join(lines)


def test_a_direct_artifact_is_served_and_its_claim_is_not_trusted(
    kama_control: KamaControl, namespace: str
) -> None:
    control = kama_control
    apply(control.stack, claim_manifest(name="uploads", namespace=namespace))
    root = claim_host_path(core=control.stack.core(), name="uploads", namespace=namespace)
    (root / "models").mkdir()
    model = write_model(
        root / "models" / "tiny.gguf", shape=ModelShape(n_layer=2, n_head_kv=2, seed=61)
    )
    apply(
        control.stack,
        pvc_artifact(namespace, "direct", "models/tiny.gguf", "Direct"),
        deployment(namespace, "chat", "direct", replicas=1, runtime={"contextSize": 512}),
    )
    status = wait_condition(control, namespace, "direct", "Ready")["status"]
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    assert status["files"] == [{"path": "tiny.gguf", "size": model.stat().st_size, "sha256": sha}]
    assert status["servingLocation"]["claimName"] == "uploads"
    assert status["servingLocation"]["subPath"] == "models"

    try:
        wait_ready(control, namespace, "chat", 1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{why_not_serving(control, namespace, 'chat')}") from exc
    (pod,) = serving_pods(control, namespace, "chat")
    args = pod["metadata"]["annotations"][ARGS_ANNOTATION].split()
    assert args[args.index("--model") + 1] == "/models/tiny.gguf"
    (container,) = pod["spec"]["containers"]
    assert {"name": ARTIFACT_LAYOUT_ENV, "value": IN_PLACE_LAYOUT} in container["env"]
    assert chat(pod)
    logs = kubectl(control.stack, "logs", pod["metadata"]["name"], "-n", namespace).stdout
    assert "verified 1 file(s) in place" in logs

    # on demand, from the Temporal CLI: the claim is read again next to the volume
    signal_artifact(control, namespace, "direct", "verify")
    eventually(
        lambda: (
            (
                condition(
                    get_json(control.stack, "modelartifact", "direct", "-n", namespace), "Verified"
                )
                or {}
            ).get("reason")
            == "Rehashed"
        ),
        timeout=120,
        what="Verified=True (Rehashed) after the verify signal",
    )

    # someone rewrites the file in place, same size: a new replica refuses to serve it
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    plan = ServingPlan(
        entrypoint="tiny.gguf",
        manifest_digest=status["manifestDigest"].removeprefix("sha256:"),
        ctx_total=512,
        concurrency=1,
    )
    apply(
        control.stack,
        runtime_pod(namespace, "tampered", plan=plan, claim="uploads", sub_path="models"),
    )

    def terminated() -> dict[str, Any] | None:
        found = get_json(control.stack, "pod", "tampered", "-n", namespace)
        statuses = found.get("status", {}).get("containerStatuses") or []
        return statuses[0]["state"].get("terminated") if statuses else None

    assert eventually(terminated, timeout=60, what="the replica to refuse")["exitCode"] == 2
    refused = kubectl(control.stack, "logs", "tampered", "-n", namespace).stdout
    assert "not the artifact verified at import" in refused

    # and the next verify finds it: the artifact is no longer Ready
    signal_artifact(control, namespace, "direct", "verify")
    obj = wait_condition(control, namespace, "direct", "ChecksumMismatch")
    assert condition(obj, "Ready")["status"] == "False"  # type: ignore[index]
    assert "changed since" in condition(obj, "ChecksumMismatch")["message"]  # type: ignore[index]
