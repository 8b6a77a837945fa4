"""GPUs as real clusters publish them, on the stack: fake nodes labelled the way GPU
Feature Discovery and the device plugin label a time-sliced card and a MIG card
(`kamadev.gpu_nodes`). A replica that fits one time-slice is bound there asking for
one slice; one that needs more than a slice is refused with the slice's memory, not
placed as if the card were four; on a MIG card each replica asks for the smallest
MIG profile that fits it, and the scheduler binds it."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from kamadev.gpu_nodes import mig_mixed, shared_gpus
from kamadev.stack import GPUNode
from tests.conftest import KamaControl
from tests.integration.test_artifact_plane import condition
from tests.integration.test_serving_plane import (
    SERVE_TIMEOUT,
    deployment,
    md,
    ready_artifact,
    remove_from_fake_nodes,
    serving_pods,
)
from tests.support import apply, eventually

GIB_CONTEXT = 1 << 21
"""Context of one slot of the generated model's that needs about 3 GiB on a GPU."""


def gpu_deployment(namespace: str, name: str, *, context: int, slots: int) -> dict[str, Any]:
    return deployment(
        namespace, name, "gpu-model", replicas=1, placement={"mode": "GPU"},
        runtime={"contextSize": context, "concurrency": slots},
    )  # fmt: skip


def bound_pod(control: KamaControl, namespace: str, name: str) -> dict[str, Any]:
    def bound() -> dict[str, Any] | None:
        pods = serving_pods(control, namespace, name)
        return pods[0] if len(pods) == 1 and pods[0]["spec"].get("nodeName") else None

    found: dict[str, Any] = eventually(bound, timeout=SERVE_TIMEOUT, what=f"{name} scheduled")
    return found


def gpu_request(pod: dict[str, Any]) -> dict[str, str]:
    limits: dict[str, str] = pod["spec"]["containers"][0]["resources"]["limits"]
    return {k: v for k, v in limits.items() if k.startswith("nvidia.com/")}


def test_time_sliced_and_mig_gpus_are_placed_as_their_labels_say(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    ready_artifact(control, namespace, tmp_path, name="gpu-model", seed=64, shared=True)
    sliced = GPUNode(
        name=f"gpu-sliced-{uuid.uuid4().hex[:4]}",
        gpus=4,
        published=shared_gpus(product="NVIDIA-L4", memory_mib=24576, count=1, replicas=4),
    )
    mig = GPUNode(
        name=f"gpu-mig-{uuid.uuid4().hex[:4]}",
        gpus=0,
        published=mig_mixed(
            product="NVIDIA-A100-SXM4-80GB",
            memory_mib=81920,
            cards=1,
            profiles={"1g.10gb": (2, 9728), "3g.40gb": (1, 40192)},
        ),
    )
    names = ["slice", "too-big", "mig-small", "mig-large"]
    control.stack.add_gpu_node(sliced)
    try:
        apply(control.stack, gpu_deployment(namespace, "slice", context=GIB_CONTEXT, slots=1))
        pod = bound_pod(control, namespace, "slice")
        assert pod["spec"]["nodeName"] == sliced.name
        assert gpu_request(pod) == {"nvidia.com/gpu": "1"}, "one slice, never two of one card"
        profile = md(control, namespace, "slice")["status"]["profile"]
        assert profile["gpuSharing"] == "time-slicing, 4 replicas per device"

        # about 6.5 GiB: more than a 6 GiB slice, less than the 24 GiB card
        apply(control.stack, gpu_deployment(namespace, "too-big", context=1 << 22, slots=2))

        def refused() -> str | None:
            fit = condition(md(control, namespace, "too-big"), "FitFailed") or {}
            return str(fit["message"]) if fit.get("status") == "True" else None

        message = eventually(refused, timeout=SERVE_TIMEOUT, what="too-big refused")
        assert "6.0 GiB" in message and "shared by 4 replicas" in message, message
        assert serving_pods(control, namespace, "too-big") == []

        remove_from_fake_nodes(control, namespace, deployments=names[:2], nodes=[sliced])
        control.stack.add_gpu_node(mig)
        # about 7.5 and 10.5 GiB: the 9.5 GiB profile, then the 39 GiB one
        apply(control.stack, gpu_deployment(namespace, "mig-small", context=1 << 22, slots=3))
        apply(control.stack, gpu_deployment(namespace, "mig-large", context=1 << 22, slots=6))
        small, large = (
            bound_pod(control, namespace, "mig-small"),
            bound_pod(control, namespace, "mig-large"),
        )
        assert small["spec"]["nodeName"] == large["spec"]["nodeName"] == mig.name
        assert gpu_request(small) == {"nvidia.com/mig-1g.10gb": "1"}
        assert gpu_request(large) == {"nvidia.com/mig-3g.40gb": "1"}
        terms = small["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"][0]["matchExpressions"][0]
        assert terms["key"] == "nvidia.com/mig-1g.10gb.product"
        assert terms["values"] == ["NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"]
    finally:
        remove_from_fake_nodes(control, namespace, deployments=names, nodes=[sliced, mig])
