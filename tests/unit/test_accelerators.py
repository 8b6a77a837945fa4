"""Tests for kama.accelerators: GPUs read as NVIDIA's device plugin and GPU Feature
Discovery publish them (whole cards, time-slicing and MPS slices, MIG with the mixed
and single strategies, missing labels), and what a serving pod then requests and pins.

The nodes come from kamadev.gpu_nodes, the same fixtures the local stack's fake GPU
nodes can carry; placement on them is in test_planner.py's table.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from activities.gguf_files import inspect_file
from kama.accelerators import DeviceKind, Sharing, device_kinds
from kama.api import ModelArtifactStatus
from kama.api.deployment import ModelDeploymentSpec
from kama.deployment_plan import decide_deployment
from kama.gguf.artifact_status import gguf_info
from kama.memory import GIB, MIB
from kama.serving_pod import serving_pod_manifest
from kamadev import gpu_nodes
from kamadev.gguf_factory import ModelShape, write_model

SLICED = gpu_nodes.shared_gpus(product="NVIDIA-L4", memory_mib=24576, count=1, replicas=4)
MIXED = gpu_nodes.mig_mixed(
    product="NVIDIA-A100-SXM4-80GB",
    memory_mib=81920,
    cards=1,
    profiles={"1g.10gb": (4, 9728), "3g.40gb": (1, 40192)},
)
SINGLE = gpu_nodes.mig_single(
    product="NVIDIA-A100-SXM4-40GB", profile="3g.20gb", memory_mib=19968, count=4
)
# A profile of a mixed node that is itself time-sliced (GFD labels it per profile).
MIXED_SLICED = gpu_nodes.Published(
    labels={
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-1g.10gb.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED",
        "nvidia.com/mig-1g.10gb.memory": "9728",
        "nvidia.com/mig-1g.10gb.replicas": "2",
        "nvidia.com/mig-1g.10gb.sharing-strategy": "time-slicing",
    },
    allocatable={"nvidia.com/mig-1g.10gb": "8"},
)
# GFD before the sharing-strategy label, sharing noticed only by the -SHARED product.
SHARED_NO_REPLICAS = gpu_nodes.Published(
    labels={"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.memory": "15360"},
    allocatable={"nvidia.com/gpu": "4"},
)
NO_GFD = gpu_nodes.Published(allocatable={"nvidia.com/gpu": "1"})


def kind(resource: str, count: int, memory_mib: int | None, **fields: Any) -> DeviceKind:
    base = resource.removesuffix(".shared")
    defaults: dict[str, Any] = {
        "vendor": "NVIDIA",
        "resource": resource,
        "count": count,
        "memory_bytes": None if memory_mib is None else memory_mib * MIB,
        "memory_label": f"{base}.memory",
        "product_label": f"{base}.product",
        "product": None,
        "device_memory_bytes": None if memory_mib is None else memory_mib * MIB,
    }
    return DeviceKind(**(defaults | fields))


KIND_CASES = [
    pytest.param(
        gpu_nodes.whole_gpus(product="NVIDIA-L4", memory_mib=23034, count=2),
        [kind("nvidia.com/gpu", 2, 23034, product="NVIDIA-L4")],
        id="whole-cards",
    ),
    pytest.param(
        SLICED,
        [
            kind(
                "nvidia.com/gpu",
                4,
                6144,  # a quarter of the card, not 4 x 24 GiB
                product="NVIDIA-L4-SHARED",
                sharing=Sharing.TIME_SLICING,
                replicas=4,
                device_memory_bytes=24 * GIB,
            )
        ],
        id="time-sliced",
    ),
    pytest.param(
        gpu_nodes.shared_gpus(
            product="NVIDIA-L4",
            memory_mib=24576,
            count=2,
            replicas=3,
            strategy="mps",
            rename_by_default=True,
        ),
        [
            kind(
                "nvidia.com/gpu.shared",
                6,
                None,
                memory_bytes=24576 * MIB // 3,
                product="NVIDIA-L4",
                sharing=Sharing.MPS,
                replicas=3,
                device_memory_bytes=24 * GIB,
            )
        ],
        id="mps-renamed",
    ),
    pytest.param(
        MIXED,
        [
            kind(
                "nvidia.com/mig-1g.10gb",
                4,
                9728,
                product="NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
                partition=True,
            ),
            kind(
                "nvidia.com/mig-3g.40gb",
                1,
                40192,
                product="NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",
                partition=True,
            ),
        ],
        id="mig-mixed-each-profile-a-kind-and-no-whole-card",
    ),
    pytest.param(
        SINGLE,
        [
            kind(
                "nvidia.com/gpu",
                4,
                19968,
                product="NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
                partition=True,
            )
        ],
        id="mig-single",
    ),
    pytest.param(
        MIXED_SLICED,
        [
            kind(
                "nvidia.com/mig-1g.10gb",
                8,
                None,
                memory_bytes=9728 * MIB // 2,
                product="NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED",
                sharing=Sharing.TIME_SLICING,
                replicas=2,
                partition=True,
                device_memory_bytes=9728 * MIB,
            )
        ],
        id="mig-profile-time-sliced",
    ),
    pytest.param(
        gpu_nodes.whole_gpus(product="NVIDIA-L4", memory_mib=None, count=1),
        [kind("nvidia.com/gpu", 1, None, product="NVIDIA-L4")],
        id="memory-label-missing",
    ),
    pytest.param(
        SHARED_NO_REPLICAS,
        [
            kind(
                "nvidia.com/gpu",
                4,
                None,
                memory_label="nvidia.com/gpu.replicas",
                product="Tesla-T4-SHARED",
                sharing=Sharing.TIME_SLICING,
                device_memory_bytes=15360 * MIB,
            )
        ],
        id="shared-but-replicas-unknown",
    ),
    pytest.param(NO_GFD, [kind("nvidia.com/gpu", 1, None)], id="device-plugin-without-gfd"),
    pytest.param(gpu_nodes.Published(), [], id="cpu-node"),
]


@pytest.mark.parametrize(("published", "expected"), KIND_CASES)
def test_device_kinds_as_published(
    published: gpu_nodes.Published, expected: list[DeviceKind]
) -> None:
    allocatable = {"cpu": "8", "memory": "64Gi", **published.allocatable}
    assert list(device_kinds(labels=published.labels, allocatable=allocatable)) == expected


@pytest.mark.parametrize(
    ("published", "per_replica", "unit"),
    [
        (gpu_nodes.whole_gpus(product="NVIDIA-L4", memory_mib=23034, count=2), 2, "GPU(s)"),
        (SLICED, 1, "time-slicing nvidia.com/gpu"),
        (MIXED, 1, "MIG nvidia.com/mig-1g.10gb"),
        (SINGLE, 1, "MIG nvidia.com/gpu"),
    ],
    ids=["whole-cards-combine", "slices-one-each", "mig-mixed-one-each", "mig-single-one-each"],
)
def test_only_whole_cards_are_combined(
    published: gpu_nodes.Published, per_replica: int, unit: str
) -> None:
    first = device_kinds(labels=published.labels, allocatable=published.allocatable)[0]
    assert (first.max_per_replica, first.unit) == (per_replica, unit)


# ---------------------------------------------------------------------------
# What the serving pod requests and pins


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> ModelArtifactStatus:
    path = write_model(
        tmp_path_factory.mktemp("m") / "m.gguf",
        shape=ModelShape(n_layer=3, n_head_kv=2, n_ctx=2048, seed=7),
    )
    facts = inspect_file(path)
    return ModelArtifactStatus.model_validate(
        {
            "phase": "Ready",
            "manifestDigest": "sha256:" + "cd" * 32,
            "files": [{"path": "m.gguf", "size": path.stat().st_size, "sha256": "ef" * 32}],
            "gguf": gguf_info(facts).model_dump(by_alias=True, exclude_none=True),
            "servingLocation": {"claimName": "kama-cache-models", "subPath": "blobs/x"},
        }
    )


SPEC = ModelDeploymentSpec.model_validate(
    {"modelRef": {"name": "m"}, "runtime": {"contextSize": 1024}, "placement": {"mode": "GPU"}}
)


@dataclasses.dataclass(frozen=True)
class PodCase:
    id: str
    published: gpu_nodes.Published
    requests: dict[str, str]  # the GPU resource requested
    pinned: tuple[str, str]  # (label, product) of the node affinity
    status: dict[str, Any]  # fields of status.profile


POD_CASES = [
    PodCase(
        "whole-card",
        gpu_nodes.whole_gpus(product="NVIDIA-L4", memory_mib=23034, count=1),
        {"nvidia.com/gpu": "1"},
        ("nvidia.com/gpu.product", "NVIDIA-L4"),
        {"gpuResource": "nvidia.com/gpu", "availableVramBytesPerGpu": 23034 * MIB},
    ),
    PodCase(
        "time-sliced",
        SLICED,
        {"nvidia.com/gpu": "1"},
        ("nvidia.com/gpu.product", "NVIDIA-L4-SHARED"),
        {
            "gpuResource": "nvidia.com/gpu",
            "gpuSharing": "time-slicing, 4 replicas per device",
            "availableVramBytesPerGpu": 6 * GIB,
        },
    ),
    PodCase(
        "mps-renamed",
        gpu_nodes.shared_gpus(
            product="NVIDIA-L4",
            memory_mib=24576,
            count=1,
            replicas=2,
            strategy="mps",
            rename_by_default=True,
        ),
        {"nvidia.com/gpu.shared": "1"},
        ("nvidia.com/gpu.product", "NVIDIA-L4"),
        {
            "gpuResource": "nvidia.com/gpu.shared",
            "gpuSharing": "mps, 2 replicas per device",
            "availableVramBytesPerGpu": 12 * GIB,
        },
    ),
    PodCase(
        "mig-mixed-smallest-profile",
        MIXED,
        {"nvidia.com/mig-1g.10gb": "1"},
        ("nvidia.com/mig-1g.10gb.product", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"),
        {"gpuResource": "nvidia.com/mig-1g.10gb", "gpuSharing": "MIG"},
    ),
    PodCase(
        "mig-single",
        SINGLE,
        {"nvidia.com/gpu": "1"},
        ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"),
        {"gpuResource": "nvidia.com/gpu", "gpuSharing": "MIG"},
    ),
]


@pytest.mark.parametrize("case", POD_CASES, ids=[c.id for c in POD_CASES])
def test_pod_requests_the_device_kind_it_was_placed_on(
    case: PodCase, artifact: ModelArtifactStatus
) -> None:
    node = gpu_nodes.node_object(name="gpu", published=case.published, memory="64Gi")
    decision = decide_deployment(spec=SPEC, artifact=artifact, nodes=[node], image="kama:dev")
    assert decision.template is not None and decision.profile is not None
    pod = serving_pod_manifest(
        template=decision.template, namespace="ns", deployment="chat", deployment_uid="u", ordinal=0
    )
    resources = pod["spec"]["containers"][0]["resources"]
    gpu_requests = {k: v for k, v in resources["requests"].items() if k not in ("cpu", "memory")}
    assert gpu_requests == case.requests
    assert {k: v for k, v in resources["limits"].items() if k != "memory"} == case.requests
    (term,) = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    label, product = case.pinned
    assert term["matchExpressions"] == [{"key": label, "operator": "In", "values": [product]}]
    assert decision.profile["gpusPerReplica"] == 1
    assert {k: decision.profile.get(k) for k in case.status} == case.status
    if "gpuSharing" not in case.status:
        assert "gpuSharing" not in decision.profile


def test_plain_gpu_templates_name_no_resource(artifact: ModelArtifactStatus) -> None:
    """Templates on whole nvidia.com/gpu cards leave the new fields unset, so their
    fingerprints are those running pods already carry."""
    whole = gpu_nodes.whole_gpus(product="NVIDIA-L4", memory_mib=23034, count=1)
    node = gpu_nodes.node_object(name="gpu", published=whole, memory="64Gi")
    decision = decide_deployment(spec=SPEC, artifact=artifact, nodes=[node], image="kama:dev")
    assert decision.template is not None
    assert decision.template.gpu_resource is None
    assert decision.template.gpu_product_label is None


def test_gpu_mode_without_any_gpu_resource_says_which(artifact: ModelArtifactStatus) -> None:
    node = gpu_nodes.node_object(name="cpu", memory="64Gi")
    decision = decide_deployment(spec=SPEC, artifact=artifact, nodes=[node], image="kama:dev")
    assert decision.template is None and decision.plan.fit_failed_message is not None
    assert "cpu (GPU): node has no nvidia.com/gpu allocatable" in decision.plan.fit_failed_message
