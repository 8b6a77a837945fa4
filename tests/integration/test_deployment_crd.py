"""The ModelDeployment CRD on the real apiserver: raw llama-server knobs are
rejected at any level, runtime values are validated with messages naming the
field, and `kubectl scale` works through the /scale subresource."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from kamadev.stack import LocalStack
from tests.support import apply, get_json, kubectl


def deployment(name: str = "chat", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"modelRef": {"name": "tiny"}, **spec}
    return {
        "apiVersion": "kama.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": body,
    }


def with_path(path: str, value: Any) -> dict[str, Any]:
    doc = deployment()
    node = doc["spec"]
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return doc


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("raw-args", with_path("args", ["--foo"]), "spec.args"),
    ("runtime-args", with_path("runtime.args", ["--ctx-size", "1"]), "spec.runtime.args"),
    ("runtime-env", with_path("runtime.env", [{"name": "X", "value": "1"}]), "spec.runtime.env"),
    ("image", with_path("image", "evil:latest"), "spec.image"),
    ("placement-command", with_path("placement.command", ["sh"]), "spec.placement.command"),
    ("ports", with_path("ports", [{"containerPort": 1}]), "spec.ports"),
    ("probes", with_path("runtime.probes", {}), "spec.runtime.probes"),
    ("expert-args", with_path("runtime.expert.args", "--x"), "spec.runtime.expert.args"),
    ("concurrency-zero", with_path("runtime.concurrency", 0), "spec.runtime.concurrency"),
    ("context-tiny", with_path("runtime.contextSize", 16), "spec.runtime.contextSize"),
    ("kv-type", with_path("runtime.kvCache", {"keyType": "q3_k"}), "spec.runtime.kvCache.keyType"),
    (
        "prompt-cache-memory",
        with_path("runtime.promptCacheMemory", "lots"),
        "spec.runtime.promptCacheMemory",
    ),
    (
        "quantized-v-without-flash-attention",
        with_path("runtime", {"kvCache": {"valueType": "q4_0"}, "flashAttention": "Off"}),
        "spec.runtime.kvCache.valueType",
    ),
    (
        "ubatch-above-batch",
        with_path("runtime", {"batchSize": 256, "microBatchSize": 512}),
        "spec.runtime.microBatchSize",
    ),
    ("mode", with_path("placement.mode", "TPU"), "spec.placement.mode"),
    ("policy", with_path("placement.policy", "Fastest"), "spec.placement.policy"),
    (
        "min-above-max",
        with_path("scaling", {"minReplicas": 3, "maxReplicas": 2}),
        "spec.scaling.minReplicas",
    ),
    ("idle-timeout", with_path("scaling.idleTimeout", "ten minutes"), "spec.scaling.idleTimeout"),
    # accepted before, then jammed the workflow (ValueError / OverflowError in its code)
    (
        "idle-timeout-overflow",
        with_path("scaling.idleTimeout", "999999999999h"),
        "spec.scaling.idleTimeout",
    ),
    ("idle-timeout-month", with_path("scaling.idleTimeout", "721h"), "spec.scaling.idleTimeout"),
    (
        "cold-start-zero",
        with_path("scaling.coldStartTimeout", "0s"),
        "spec.scaling.coldStartTimeout",
    ),
    (
        "concurrency-without-context",
        with_path("runtime.concurrency", 4),
        "spec.runtime.contextSize",
    ),
    ("gpu-resources", with_path("resources.nvidia.com/gpu", "1"), "spec.resources"),
    ("memory-quantity", with_path("resources.memory", "lots"), "spec.resources.memory"),
    ("no-model", {**deployment(), "spec": {"replicas": 1}}, "spec.modelRef"),
]


@pytest.mark.parametrize(
    ("doc", "field"), [(d, f) for _, d, f in INVALID], ids=[i for i, _, _ in INVALID]
)
def test_invalid_deployments_are_rejected_naming_the_field(
    crds: LocalStack, namespace: str, doc: dict[str, Any], field: str
) -> None:
    doc = copy.deepcopy(doc)
    doc["metadata"]["namespace"] = namespace

    result = kubectl(crds, "apply", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert result.returncode != 0, f"accepted: {doc}"
    assert field in result.stderr, result.stderr


def test_scale_subresource_and_columns(crds: LocalStack, namespace: str) -> None:
    doc = deployment(runtime={"contextSize": 2048, "concurrency": 2}, scaling={"maxReplicas": 3})
    doc["metadata"]["namespace"] = namespace
    apply(crds, doc)
    kubectl(crds, "scale", "modeldeployment", "chat", "-n", namespace, "--replicas=2")
    obj = get_json(crds, "md", "chat", "-n", namespace)
    assert obj["spec"]["replicas"] == 2
    assert (
        obj["spec"]["scaling"]["minReplicas"] == 0
        and obj["spec"]["scaling"]["idleTimeout"] == "10m"
    )
    header, row = kubectl(crds, "get", "modeldeployments", "-n", namespace).stdout.splitlines()
    assert header.split() == ["NAME", "MODEL", "MODE", "DESIRED", "MAX", "READY", "REASON", "AGE"]
    # DESIRED is what Kama converges to (status), against the autoscaler's cap;
    # columns without status stay blank
    assert row[header.index("DESIRED") : header.index("READY")].split() == ["3"], row
    kubectl(
        crds, "patch", "md", "chat", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", '{"status": {"desiredReplicas": 2}}',
    )  # fmt: skip
    header, row = kubectl(crds, "get", "modeldeployments", "-n", namespace).stdout.splitlines()
    assert row[header.index("DESIRED") : header.index("READY")].split() == ["2", "3"], row
