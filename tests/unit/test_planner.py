"""Tests for kama.planner and kama.memory: the pure placement planner and its estimator,
with its inputs (kama.quantities, kama.node_inventory, ModelFacts from the artifact's
status) and its output as llama-server flags (the ServingPlan a serving pod runs).

Placement is table-driven: synthetic 7B/13B/34B-like F16 models (tensor sizes laid out
as llama.cpp's llama architecture has them) against H100 / L4 / A10 / RTX 4090 nodes.
Every case checks that the runtime envelope (context, slots, KV types) comes back
unchanged: the planner may only move a model, never shrink what was asked for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from activities.gguf_files import inspect_file
from kama.api import GGUFInfo
from kama.api.deployment_choices import FlashAttention, KVCacheType, PlacementMode, PlacementPolicy
from kama.deployment_plan import ArtifactNotUsable, model_facts, serving_plan
from kama.gguf.artifact_status import gguf_info
from kama.memory import (
    CUDA_CONTEXT_RESERVE_BYTES,
    HOST_OVERHEAD_BYTES,
    MIB,
    RuntimeEnvelope,
    assign_units,
    estimate_memory,
    kv_cache_bytes,
)
from kama.model_facts import ModelFacts
from kama.node_inventory import NodeInventory, Taint, node_from_k8s
from kama.placement_plan import Placement, PlacementPlan, Profile, ProfileMode, SplitMode
from kama.planner import plan_placement
from kama.quantities import parse_bytes, parse_cpu_millicores, parse_quantity
from kamadev import gpu_nodes
from kamadev.gguf_factory import ModelShape, write_model

GIB = 1 << 30


def synthetic_model(
    *,
    n_layer: int,
    n_embd: int,
    n_ff: int,
    n_head: int,
    n_head_kv: int,
    n_vocab: int = 32000,
    bytes_per_weight: int = 2,
    n_ctx_train: int = 4096,
) -> ModelFacts:
    """Facts of an F16 llama-architecture model, tensor by tensor."""
    head_dim = n_embd // n_head
    kv_dim = head_dim * n_head_kv
    norm = n_embd * 4
    tensors = {
        "token_embd.weight": n_vocab * n_embd * bytes_per_weight,
        "output_norm.weight": norm,
        "output.weight": n_vocab * n_embd * bytes_per_weight,
    }
    for i in range(n_layer):
        tensors |= {
            f"blk.{i}.attn_norm.weight": norm,
            f"blk.{i}.attn_q.weight": n_embd * n_embd * bytes_per_weight,
            f"blk.{i}.attn_k.weight": n_embd * kv_dim * bytes_per_weight,
            f"blk.{i}.attn_v.weight": n_embd * kv_dim * bytes_per_weight,
            f"blk.{i}.attn_output.weight": n_embd * n_embd * bytes_per_weight,
            f"blk.{i}.ffn_norm.weight": norm,
            f"blk.{i}.ffn_gate.weight": n_embd * n_ff * bytes_per_weight,
            f"blk.{i}.ffn_up.weight": n_embd * n_ff * bytes_per_weight,
            f"blk.{i}.ffn_down.weight": n_embd * n_ff * bytes_per_weight,
        }
    return ModelFacts(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim,
        head_dim_v=head_dim,
        n_ctx_train=n_ctx_train,
        n_vocab=n_vocab,
        n_ff=n_ff,
        tensor_bytes=tensors,
        file_type="F16",
    )


# ~5 GiB of weights, ~5.6 GiB of VRAM at 4k context: a 6 GiB slice of a 24 GiB card.
M3 = synthetic_model(n_layer=24, n_embd=3072, n_ff=8192, n_head=24, n_head_kv=8)
# ~11 GiB of weights (~12 GiB VRAM): one 24 GB GPU.
M7 = synthetic_model(n_layer=32, n_embd=4096, n_ff=11008, n_head=32, n_head_kv=8)
# ~24 GiB, full multi-head attention (a large KV): two 24 GB GPUs.
M13 = synthetic_model(n_layer=40, n_embd=5120, n_ff=13824, n_head=40, n_head_kv=40)
# ~63 GiB: four L4s (three are just too small), or one H100.
M34 = synthetic_model(n_layer=48, n_embd=8192, n_ff=22016, n_head=64, n_head_kv=8)

H100_MIB, L4_MIB, A10_MIB, RTX4090_MIB = 81559, 23034, 23028, 24564


def published_node(
    name: str,
    published: gpu_nodes.Published,
    *,
    ram_gib: int = 256,
    cpu: int = 64,
    taints: tuple[Taint, ...] = (),
    labels: Mapping[str, str] | None = None,
) -> NodeInventory:
    """A node as GFD and the device plugin publish it, read the production way."""
    return node_from_k8s(
        gpu_nodes.node_object(
            name=name,
            published=published,
            cpu=str(cpu),
            memory=f"{ram_gib}Gi",
            labels=labels,
            taints=[{"key": k, "value": v, "effect": e} for k, v, e in taints],
        )
    )


def gpu_node(
    name: str,
    *,
    product: str,
    memory_mib: int | None,
    count: int,
    ram_gib: int = 256,
    cpu: int = 64,
    taints: tuple[Taint, ...] = (),
    labels: Mapping[str, str] | None = None,
) -> NodeInventory:
    whole = gpu_nodes.whole_gpus(product=product, memory_mib=memory_mib, count=count)
    return published_node(name, whole, ram_gib=ram_gib, cpu=cpu, taints=taints, labels=labels)


def cpu_node(
    name: str, *, ram_gib: int, cpu: int = 32, labels: Mapping[str, str] | None = None
) -> NodeInventory:
    return NodeInventory(
        name=name,
        cpu_millicores=cpu * 1000,
        memory_bytes=ram_gib * GIB,
        labels=dict(labels or {}),
    )


H100X1 = gpu_node("h100-1", product="NVIDIA-H100-80GB-HBM3", memory_mib=H100_MIB, count=1)
L4X1 = gpu_node("l4-1", product="NVIDIA-L4", memory_mib=L4_MIB, count=1, ram_gib=128)
L4X2 = gpu_node("l4-2", product="NVIDIA-L4", memory_mib=L4_MIB, count=2)
L4X4 = gpu_node("l4-4", product="NVIDIA-L4", memory_mib=L4_MIB, count=4)
L4X8 = gpu_node("l4-8", product="NVIDIA-L4", memory_mib=L4_MIB, count=8, ram_gib=512)
A10X1 = gpu_node("a10-1", product="NVIDIA-A10", memory_mib=A10_MIB, count=1)
RTX4090X2 = gpu_node(
    "rtx4090-2", product="NVIDIA-GeForce-RTX-4090", memory_mib=RTX4090_MIB, count=2
)
CPU_BIG = cpu_node("cpu-big", ram_gib=256)
CPU_SMALL = cpu_node("cpu-small", ram_gib=32)
GPU_TAINT: Taint = ("nvidia.com/gpu", "present", "NoSchedule")
TAINTED_H100 = dataclasses.replace(H100X1, name="h100-tainted", taints=(GPU_TAINT,))

CTX4K = RuntimeEnvelope(context_size=4096)

# GPUs as GFD and the device plugin publish them (kama.accelerators reads them).
CARD_24G_MIB = 24576
TIME_SLICED = published_node(  # one 24 GiB card, 4 time-slicing replicas: 4 x 6 GiB
    "l4-sliced",
    gpu_nodes.shared_gpus(product="NVIDIA-L4", memory_mib=CARD_24G_MIB, count=1, replicas=4),
)
TIME_SLICED_X2 = published_node(  # two such cards: 8 slices, never a split over two
    "l4-sliced-2",
    gpu_nodes.shared_gpus(product="NVIDIA-L4", memory_mib=CARD_24G_MIB, count=2, replicas=4),
)
MPS_RENAMED = published_node(  # MPS, renameByDefault: nvidia.com/gpu.shared, no -SHARED
    "l4-mps",
    gpu_nodes.shared_gpus(
        product="NVIDIA-L4",
        memory_mib=CARD_24G_MIB,
        count=1,
        replicas=4,
        strategy="mps",
        rename_by_default=True,
    ),
)
A100_80_MIB, MIG_1G10_MIB, MIG_3G40_MIB, MIG_3G20_MIB = 81920, 9728, 40192, 19968
MIG_MIXED = published_node(  # 4 x 1g.10gb and 1 x 3g.40gb on one A100 80GB
    "a100-mig",
    gpu_nodes.mig_mixed(
        product="NVIDIA-A100-SXM4-80GB",
        memory_mib=A100_80_MIB,
        cards=1,
        profiles={"1g.10gb": (4, MIG_1G10_MIB), "3g.40gb": (1, MIG_3G40_MIB)},
    ),
)
MIG_SINGLE = published_node(  # two A100 40GB, each as 2 x 3g.20gb, behind nvidia.com/gpu
    "a100-mig-single",
    gpu_nodes.mig_single(
        product="NVIDIA-A100-SXM4-40GB", profile="3g.20gb", memory_mib=MIG_3G20_MIB, count=4
    ),
)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    model: ModelFacts
    nodes: tuple[NodeInventory, ...]
    mode: ProfileMode | None  # None: FitFailed
    node: str | None = None
    gpus: int = 0
    envelope: RuntimeEnvelope = CTX4K
    placement: Placement = dataclasses.field(default_factory=Placement)
    rejected: tuple[str, ...] = ()  # each must appear in some rejection's description
    resource: str | None = None  # the GPU resource each replica requests, when checked
    message: tuple[str, ...] = ()  # each must appear in the FitFailed message / degraded reason


CASES = [
    Case("7b-one-l4", M7, (L4X1,), ProfileMode.GPU, "l4-1", 1),
    Case("7b-one-a10", M7, (A10X1,), ProfileMode.GPU, "a10-1", 1),
    Case(
        "13b-two-l4",
        M13,
        (L4X2,),
        ProfileMode.GPU,
        "l4-2",
        2,
        rejected=("l4-2 (GPU on 1 GPU(s), 41 GPU layers): needs",),
    ),
    Case("13b-two-rtx4090", M13, (RTX4090X2,), ProfileMode.GPU, "rtx4090-2", 2),
    Case("34b-four-l4", M34, (L4X4,), ProfileMode.GPU, "l4-4", 4),
    Case(
        "34b-fewest-of-eight-l4",
        M34,
        (L4X8,),
        ProfileMode.GPU,
        "l4-8",
        4,
        rejected=("GPU on 1 GPU(s)", "GPU on 2 GPU(s)", "GPU on 3 GPU(s)", "VRAM per GPU"),
    ),
    Case("34b-one-h100", M34, (H100X1, L4X4), ProfileMode.GPU, "h100-1", 1),
    Case(
        "34b-hybrid-on-one-l4",
        M34,
        (L4X1,),
        ProfileMode.HYBRID,
        "l4-1",
        1,
        rejected=("l4-1 (GPU on 1 GPU(s), 49 GPU layers): needs",),
        message=("hybrid:", "of 49 layers on 1 GPU(s)", "VRAM per GPU"),
    ),
    Case(
        "7b-cpu-only-node",
        M7,
        (CPU_BIG,),
        ProfileMode.CPU,
        "cpu-big",
        message=(),  # Auto on a cluster without a GPU: CPU is what it asked for
    ),
    Case(
        "34b-fit-failed-small-cpu",
        M34,
        (CPU_SMALL,),
        None,
        rejected=("cpu-small (CPU): needs",),
        message=("no node fits", "RAM, node has 32.0 GiB (34359738368 bytes) allocatable"),
    ),
    Case(
        "34b-fit-failed-everywhere",
        M34,
        (
            CPU_SMALL,
            gpu_node("l4-lowram", product="NVIDIA-L4", memory_mib=L4_MIB, count=1, ram_gib=16),
        ),
        None,
        message=("closest:", "VRAM per GPU", "RAM", "candidate(s) rejected in all"),
    ),
    Case(
        "mode-cpu-on-gpu-node",
        M7,
        (L4X1,),
        ProfileMode.CPU,
        "l4-1",
        placement=Placement(mode=PlacementMode.CPU),
    ),
    Case(
        "mode-gpu-refuses-hybrid",
        M34,
        (L4X1,),
        None,
        placement=Placement(mode=PlacementMode.GPU),
        rejected=("would fit as hybrid", "never falls back to hybrid or CPU"),
        message=("placement.mode GPU never falls back",),
    ),
    Case(
        "mode-gpu-refuses-cpu-node",
        M7,
        (CPU_BIG,),
        None,
        placement=Placement(mode=PlacementMode.GPU),
        rejected=("cpu-big (GPU): node has no nvidia.com/gpu allocatable",),
        message=("other reasons: cpu-big (GPU): node has no nvidia.com/gpu allocatable",),
    ),
    Case(
        "untolerated-taint-falls-back-to-cpu",
        M7,
        (TAINTED_H100, CPU_BIG),
        ProfileMode.CPU,
        "cpu-big",
        rejected=("h100-tainted (node): untolerated taint nvidia.com/gpu=present:NoSchedule",),
        message=("CPU only", "h100-tainted (node): untolerated taint nvidia.com/gpu"),
    ),
    Case(
        "untolerated-taint-fit-failed",
        M7,
        (TAINTED_H100,),
        None,
        message=("untolerated taint nvidia.com/gpu=present:NoSchedule",),
    ),
    Case(
        "tolerated-taint",
        M7,
        (TAINTED_H100, CPU_BIG),
        ProfileMode.GPU,
        "h100-tainted",
        1,
        placement=Placement(tolerations=(("nvidia.com/gpu", "Exists", "", "NoSchedule"),)),
    ),
    Case(
        "node-selector-picks-pool",
        M7,
        (H100X1, dataclasses.replace(L4X1, labels={**L4X1.labels, "pool": "inference"})),
        ProfileMode.GPU,
        "l4-1",
        1,
        placement=Placement(node_selector={"pool": "inference"}, policy=PlacementPolicy.LATENCY),
        rejected=("h100-1 (node): node selector pool=inference does not match (label absent)",),
    ),
    Case(
        "max-gpus-forces-hybrid",
        M34,
        (L4X8,),
        ProfileMode.HYBRID,
        "l4-8",
        2,
        placement=Placement(max_gpus_per_replica=2),
        rejected=("needs 4 GPUs, over maxGPUsPerReplica=2",),
    ),
    Case(
        "max-gpus-allows-h100",
        M34,
        (L4X8, H100X1),
        ProfileMode.GPU,
        "h100-1",
        1,
        placement=Placement(max_gpus_per_replica=1),
    ),
    Case(
        "direct-rwo-artifact-pins-node",
        M7,
        (H100X1, L4X1, A10X1),
        ProfileMode.GPU,
        "a10-1",
        1,
        placement=Placement(allowed_nodes=frozenset({"a10-1"})),
        rejected=("h100-1 (node): cannot mount the artifact", "l4-1 (node): cannot mount"),
    ),
    Case("balanced-packs-smallest-gpu", M7, (H100X1, L4X1), ProfileMode.GPU, "l4-1", 1),
    Case(
        "latency-takes-roomiest-gpu",
        M7,
        (H100X1, L4X1),
        ProfileMode.GPU,
        "h100-1",
        1,
        placement=Placement(policy=PlacementPolicy.LATENCY),
    ),
    Case(
        "throughput-spreads-over-slots",
        M7,
        (L4X8,),
        ProfileMode.GPU,
        "l4-8",
        4,
        envelope=RuntimeEnvelope(context_size=4096, concurrency=4),
        placement=Placement(policy=PlacementPolicy.THROUGHPUT),
    ),
    Case(
        "balanced-same-slots-one-gpu",
        M7,
        (L4X8,),
        ProfileMode.GPU,
        "l4-8",
        1,
        envelope=RuntimeEnvelope(context_size=4096, concurrency=4),
    ),
    Case(
        "throughput-one-slot-is-latency",
        M7,
        (H100X1, L4X8),
        ProfileMode.GPU,
        "h100-1",
        1,
        placement=Placement(policy=PlacementPolicy.THROUGHPUT),
    ),
    Case(
        "long-context-needs-two-gpus",
        M7,
        (L4X2,),
        ProfileMode.GPU,
        "l4-2",
        2,
        envelope=RuntimeEnvelope(context_size=32768, concurrency=4),
    ),
    Case(
        "q8-kv-fits-one-gpu",
        M7,
        (L4X2,),
        ProfileMode.GPU,
        "l4-2",
        1,
        envelope=RuntimeEnvelope(
            context_size=32768,
            concurrency=4,
            kv_key_type=KVCacheType.Q8_0,
            kv_value_type=KVCacheType.Q8_0,
            flash_attention=FlashAttention.ON,
        ),
    ),
    Case(
        "native-context-single-slot",
        M13,
        (RTX4090X2,),
        ProfileMode.GPU,
        "rtx4090-2",
        2,
        envelope=RuntimeEnvelope(),
    ),
    Case(
        "gpu-memory-label-missing-uses-cpu",
        M7,
        (gpu_node("no-gfd", product="NVIDIA-L4", memory_mib=None, count=1),),
        ProfileMode.CPU,
        "no-gfd",
        rejected=("GPU memory unknown: node lacks the nvidia.com/gpu.memory label",),
        message=("no-gfd (GPU): GPU memory unknown",),
    ),
    Case(
        "cpu-prefers-node-without-gpus",
        M7,
        (L4X8, CPU_BIG),  # the GPU node has more RAM, but GPUs are kept for GPU work
        ProfileMode.CPU,
        "cpu-big",
        placement=Placement(mode=PlacementMode.CPU),
    ),
    Case(
        "threads-exceed-node-cpu",
        M7,
        (cpu_node("cpu-4", ram_gib=64, cpu=4), CPU_BIG),
        ProfileMode.CPU,
        "cpu-big",
        envelope=RuntimeEnvelope(context_size=4096, threads=8),
        rejected=("cpu-4 (node): needs 8000m CPU, node has 4000m allocatable",),
    ),
    Case("no-nodes", M7, (), None, message=("there are no nodes",)),
    # Time-slicing: a slice is a quarter of one card, and a replica takes one.
    Case("time-sliced-5g-model-fits-a-slice", M3, (TIME_SLICED,), ProfileMode.GPU, "l4-sliced", 1),
    Case(
        "time-sliced-12g-model-does-not-fit-a-6g-slice",
        M7,
        (TIME_SLICED,),
        None,
        placement=Placement(mode=PlacementMode.GPU),
        rejected=(
            "l4-sliced (GPU on 1 time-slicing nvidia.com/gpu, 33 GPU layers): needs",
            "a time-slicing slice of NVIDIA-L4-SHARED has 6.0 GiB (6442450944 bytes): "
            "one 24.0 GiB card shared by 4 replicas",
            "no layer split over 4 allocatable nvidia.com/gpu: a replica takes one, "
            "because two slices may be the same card",
        ),
        message=("closest: l4-sliced (GPU on 1 time-slicing nvidia.com/gpu",),
    ),
    Case(
        "time-sliced-auto-is-hybrid-on-one-slice",
        M7,
        (TIME_SLICED,),
        ProfileMode.HYBRID,
        "l4-sliced",
        1,
        message=("on 1 time-slicing nvidia.com/gpu, the rest on CPU", "has 6.0 GiB"),
    ),
    Case(
        "time-sliced-cards-are-never-combined",  # 2 x 24 GiB whole cards would split it
        M13,
        (TIME_SLICED_X2,),
        ProfileMode.HYBRID,
        "l4-sliced-2",
        1,
        rejected=("no layer split over 8 allocatable nvidia.com/gpu",),
    ),
    Case(
        "mps-renamed-requests-the-shared-resource",
        M3,
        (MPS_RENAMED,),
        ProfileMode.GPU,
        "l4-mps",
        1,
        resource="nvidia.com/gpu.shared",
    ),
    Case(
        "whole-card-preferred-to-hybrid-on-a-slice",
        M7,
        (TIME_SLICED, L4X1),
        ProfileMode.GPU,
        "l4-1",
        1,
        resource="nvidia.com/gpu",
    ),
    # MIG, mixed strategy: each profile is a device kind with its own memory.
    Case(
        "mig-mixed-smallest-profile-that-fits",
        M3,
        (MIG_MIXED,),
        ProfileMode.GPU,
        "a100-mig",
        1,
        resource="nvidia.com/mig-1g.10gb",
    ),
    Case(
        "mig-mixed-larger-profile-when-small-is-short",
        M7,
        (MIG_MIXED,),
        ProfileMode.GPU,
        "a100-mig",
        1,
        resource="nvidia.com/mig-3g.40gb",
        rejected=(
            "a100-mig (GPU on 1 MIG nvidia.com/mig-1g.10gb, 33 GPU layers): needs",
            "MIG instance NVIDIA-A100-SXM4-80GB-MIG-1g.10gb has 9.5 GiB",
        ),
    ),
    Case(
        "mig-mixed-latency-takes-the-roomiest-profile",
        M3,
        (MIG_MIXED,),
        ProfileMode.GPU,
        "a100-mig",
        1,
        resource="nvidia.com/mig-3g.40gb",
        placement=Placement(policy=PlacementPolicy.LATENCY),
    ),
    # MIG, single strategy: nvidia.com/gpu is an instance; a replica takes one.
    Case("mig-single-instance", M7, (MIG_SINGLE,), ProfileMode.GPU, "a100-mig-single", 1),
    Case(
        "mig-single-instances-are-never-combined",
        M13,
        (MIG_SINGLE,),
        ProfileMode.HYBRID,
        "a100-mig-single",
        1,
        resource="nvidia.com/gpu",
        rejected=(
            "MIG instance NVIDIA-A100-SXM4-40GB-MIG-3g.20gb has 19.5 GiB",
            "no layer split over 4 allocatable nvidia.com/gpu: a replica takes one, "
            "because a CUDA process uses one MIG instance",
        ),
    ),
]


def _assert_envelope_echoed(plan: PlacementPlan, envelope: RuntimeEnvelope) -> None:
    assert plan.envelope is envelope
    if plan.selected is not None:
        assert plan.selected.envelope is envelope
        expected_ctx = envelope.context_size or 0
        if envelope.context_size is not None:
            assert plan.selected.context_per_slot == expected_ctx
        assert plan.selected.ctx_total == plan.selected.context_per_slot * envelope.concurrency
    # the envelope itself is frozen and was not rebuilt with other values
    assert dataclasses.astuple(plan.envelope) == dataclasses.astuple(envelope)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_placement(case: Case) -> None:
    plan = plan_placement(
        model=case.model, envelope=case.envelope, placement=case.placement, nodes=case.nodes
    )
    _assert_envelope_echoed(plan, case.envelope)
    descriptions = [r.describe() for r in plan.rejected]
    for wanted in case.rejected:
        assert any(wanted in d for d in descriptions), (wanted, descriptions)
    if case.mode is None:
        assert plan.selected is None and plan.fit_failed
        assert plan.fit_failed_message is not None
        message = plan.fit_failed_message
        assert f"KV {case.envelope.kv_key_type}/{case.envelope.kv_value_type}" in message
        assert f"x {case.envelope.concurrency} slot(s)" in message
        for wanted in case.message:
            assert wanted in message, message
        return
    profile = plan.selected
    assert profile is not None and plan.fit_failed_message is None
    assert (profile.mode, profile.node, profile.gpus_per_replica) == (
        case.mode,
        case.node,
        case.gpus,
    ), descriptions
    assert profile.decision == "Estimated"
    if case.resource is not None:
        assert profile.device is not None and profile.device.resource == case.resource
    full = case.model.n_layer + 1
    assert profile.total_layers == full
    assert profile.ram_bytes <= profile.ram_available_bytes
    assert (
        profile.vram_bytes_per_gpu <= profile.vram_available_bytes_per_gpu
        or not profile.gpus_per_replica
    )
    if profile.mode is ProfileMode.GPU:
        assert profile.n_gpu_layers == full and profile.degraded_reason is None
    elif profile.mode is ProfileMode.HYBRID:
        assert 0 < profile.n_gpu_layers < full
        assert profile.degraded_reason is not None
    else:
        assert profile.n_gpu_layers == 0 and profile.vram_bytes_per_gpu == 0
        assert profile.gpu_product is None
        as_asked = case.placement.mode is PlacementMode.CPU or not any(
            node.has_gpus for node in case.nodes
        )
        assert (profile.degraded_reason is None) == as_asked
    if profile.gpus_per_replica > 1:
        assert profile.split_mode is SplitMode.LAYER
        assert profile.tensor_split == (1,) * profile.gpus_per_replica
    else:
        assert profile.split_mode is SplitMode.NONE and profile.tensor_split == ()
    for wanted in case.message:
        assert profile.degraded_reason is not None and wanted in profile.degraded_reason


def test_case_count() -> None:
    assert len(CASES) >= 24


def test_hybrid_takes_the_most_layers_that_fit() -> None:
    plan = plan_placement(model=M34, envelope=CTX4K, placement=Placement(), nodes=(L4X1,))
    profile = plan.selected
    assert profile is not None and profile.mode is ProfileMode.HYBRID
    _assert_envelope_echoed(plan, CTX4K)
    more = estimate_memory(model=M34, envelope=CTX4K, n_gpu_layers=profile.n_gpu_layers + 1, gpus=1)
    assert more.vram_bytes_per_gpu > L4_MIB * MIB >= profile.vram_bytes_per_gpu
    # llama.cpp offloads the output layer first, then the last repeating layers.
    assert profile.estimate.gpus[0].holds_output
    assert profile.estimate.gpus[0].n_layers == profile.n_gpu_layers - 1
    assert profile.estimate.host.n_layers == M34.n_layer - profile.n_gpu_layers + 1


def test_policies_choose_differently() -> None:
    env = RuntimeEnvelope(context_size=4096, concurrency=4)
    chosen = {}
    for policy in PlacementPolicy:
        plan = plan_placement(
            model=M7, envelope=env, placement=Placement(policy=policy), nodes=(H100X1, L4X8)
        )
        _assert_envelope_echoed(plan, env)
        assert plan.selected is not None
        chosen[policy] = (plan.selected.node, plan.selected.gpus_per_replica)
    assert chosen == {
        PlacementPolicy.BALANCED: ("l4-8", 1),
        PlacementPolicy.LATENCY: ("h100-1", 1),
        PlacementPolicy.THROUGHPUT: ("l4-8", 4),
    }


# ---------------------------------------------------------------------------
# The estimator


@pytest.mark.parametrize(
    ("envelope", "per_cell_per_layer"),
    [
        # 8 KV heads x 128 dims = 1024 elements each for K and V.
        (RuntimeEnvelope(context_size=4096), 1024 * 2 + 1024 * 2),
        (
            RuntimeEnvelope(
                context_size=4096,
                concurrency=3,
                kv_key_type=KVCacheType.Q8_0,
                kv_value_type=KVCacheType.Q4_0,
            ),
            1024 // 32 * 34 + 1024 // 32 * 18,
        ),
        (
            RuntimeEnvelope(context_size=2048, concurrency=2, kv_key_type=KVCacheType.F32),
            1024 * 4 + 1024 * 2,
        ),
        (
            RuntimeEnvelope(
                context_size=8192, kv_key_type=KVCacheType.BF16, kv_value_type=KVCacheType.IQ4_NL
            ),
            1024 * 2 + 1024 // 32 * 18,
        ),
    ],
    ids=["f16-f16", "q8_0-q4_0-3-slots", "f32-f16-2-slots", "bf16-iq4_nl"],
)
def test_kv_bytes_by_hand(envelope: RuntimeEnvelope, per_cell_per_layer: int) -> None:
    assert envelope.context_size is not None
    n_ctx_total = envelope.context_size * envelope.concurrency
    expected = M7.n_layer * n_ctx_total * per_cell_per_layer
    assert kv_cache_bytes(model=M7, envelope=envelope) == expected
    # the same via DESIGN's formula with bytes per element as fractions
    sizes = {"f16": Fraction(2), "f32": Fraction(4), "bf16": Fraction(2)}
    sizes |= {"q8_0": Fraction(34, 32), "q4_0": Fraction(18, 32), "iq4_nl": Fraction(18, 32)}
    design = (
        M7.n_layer
        * n_ctx_total
        * M7.n_head_kv
        * (
            M7.head_dim_k * sizes[envelope.kv_key_type]
            + M7.head_dim_v * sizes[envelope.kv_value_type]
        )
    )
    assert design == expected
    assert envelope == dataclasses.replace(envelope)


def test_kv_context_is_padded_to_256_cells() -> None:
    envelope = RuntimeEnvelope(context_size=1000, concurrency=2)
    assert kv_cache_bytes(model=M7, envelope=envelope) == 32 * 1024 * 2 * 4096
    assert envelope.context_size == 1000


def test_estimate_full_gpu_by_hand() -> None:
    no_flash = RuntimeEnvelope(context_size=4096, flash_attention=FlashAttention.OFF)
    est = estimate_memory(model=M7, envelope=no_flash, n_gpu_layers=33, gpus=1)
    (gpu,) = est.gpus
    embd = 32000 * 4096 * 2
    assert gpu.weights_bytes == M7.total_weight_bytes - embd  # token_embd stays on the host
    assert est.host.weights_bytes == embd
    assert gpu.kv_bytes == kv_cache_bytes(model=M7, envelope=CTX4K) and est.host.kv_bytes == 0
    assert gpu.overhead_bytes == CUDA_CONTEXT_RESERVE_BYTES
    ub, ctx = 512, 4096
    activations = ub * (4 * 4096 + 2 * 11008) * 4
    attention = ctx * ub * 32 * 4 + ctx * ub * 2
    logits = 1 * 32000 * 4  # one slot: llama-server keeps one output row, not ub
    assert gpu.compute_bytes == activations + attention + logits
    assert est.host.compute_bytes == ub * 4096 * 4
    assert est.host.output_bytes == 1 * 32000 * 4  # the logits buffer, one row per slot
    assert est.host.overhead_bytes >= HOST_OVERHEAD_BYTES
    flash = estimate_memory(
        model=M7,
        envelope=RuntimeEnvelope(context_size=4096, flash_attention=FlashAttention.AUTO),
        n_gpu_layers=33,
        gpus=1,
    )
    # Auto counts as on: llama-server enables flash attention where the backend has it
    assert gpu.compute_bytes - flash.gpus[0].compute_bytes == ctx * ub * 32 * 4


def test_tied_embeddings_duplicate_on_gpu() -> None:
    tied = dict(M7.tensor_bytes)
    del tied["output.weight"]
    model = dataclasses.replace(M7, tensor_bytes=tied)
    est = estimate_memory(model=model, envelope=CTX4K, n_gpu_layers=1, gpus=1)
    assert est.gpus[0].weights_bytes == 32000 * 4096 * 2 + 4096 * 4
    assert est.gpus[0].n_layers == 0 and est.gpus[0].holds_output


@pytest.mark.parametrize(
    ("n_layer", "n_gpu_layers", "split", "expected"),
    [
        (4, 0, (), (None,) * 5),
        (4, 1, (), (None, None, None, None, 0)),
        (4, 5, (), (0,) * 5),
        (4, 5, (1, 1), (0, 0, 0, 1, 1)),
        (5, 6, (1, 1, 1), (0, 0, 1, 1, 2, 2)),
        (4, 3, (3, 1), (None, None, 0, 0, 0)),
    ],
    ids=["none", "output-only", "all-one-gpu", "even-2", "even-3", "uneven-split"],
)
def test_assign_units_like_llama_cpp(
    n_layer: int, n_gpu_layers: int, split: tuple[int, ...], expected: tuple[int | None, ...]
) -> None:
    got = assign_units(n_layer=n_layer, n_gpu_layers=n_gpu_layers, tensor_split=split)
    assert got == expected


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"context_size": 0}, "context_size must be >= 1"),
        ({"concurrency": 2}, "concurrency must be 1 when context_size is omitted"),
        ({"context_size": 512, "batch_size": 256}, "micro_batch_size 512 is larger"),
        (
            {"kv_value_type": KVCacheType.Q4_0, "flash_attention": FlashAttention.OFF},
            "requires flash attention",
        ),
    ],
    ids=["zero-context", "slots-without-context", "ubatch-over-batch", "quantized-v-no-fa"],
)
def test_envelope_validation(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        RuntimeEnvelope(**kwargs)


def test_model_facts_from_generated_gguf(tmp_path: Path) -> None:
    shape = ModelShape(n_layer=3, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=512)
    facts = inspect_file(write_model(tmp_path / "m.gguf", shape=shape))
    model = model_facts(gguf_info(facts))
    assert (model.n_layer, model.n_embd, model.n_head, model.n_head_kv) == (3, 64, 4, 2)
    assert (model.head_dim_k, model.head_dim_v, model.n_ctx_train) == (16, 16, 512)
    assert model.n_vocab == shape.n_vocab and model.n_ff == 128 and model.file_type == "F32"
    assert model.total_weight_bytes == facts.tensor_bytes
    kv_dim = 2 * 16
    per_layer = 4 * (2 * 64 + 2 * 64 * 64 + 2 * 64 * kv_dim + 3 * 64 * 128)
    assert model.layer_weight_bytes == (per_layer,) * 3
    assert model.output_weight_bytes == 4 * (64 + shape.n_vocab * 64)
    assert model.host_only_weight_bytes == 4 * shape.n_vocab * 64
    envelope = RuntimeEnvelope()
    plan = plan_placement(
        model=model,
        envelope=envelope,
        placement=Placement(),
        nodes=(cpu_node("tiny", ram_gib=1, cpu=2),),
    )
    _assert_envelope_echoed(plan, envelope)
    assert plan.selected is not None and plan.selected.mode is ProfileMode.CPU
    assert plan.selected.context_per_slot == 512
    args = llama_server_args(plan.selected, model_dir="/models", host="10.0.0.7", port=8080)
    assert args[args.index("--ctx-size") + 1] == "512"
    assert args[args.index("--n-gpu-layers") + 1] == "0"
    assert "--split-mode" not in args


def test_model_facts_from_gguf_names_missing_facts(tmp_path: Path) -> None:
    facts = inspect_file(write_model(tmp_path / "m.gguf", shape=ModelShape()))
    with pytest.raises(ArtifactNotUsable, match="contextLength"):
        model_facts(gguf_info(dataclasses.replace(facts, n_ctx_train=None)))


def test_model_facts_keep_per_layer_kv_heads(tmp_path: Path) -> None:
    shape = ModelShape(n_layer=3, n_embd=64, n_head=4, n_head_kv=2, n_ctx=512)
    uniform = inspect_file(write_model(tmp_path / "m.gguf", shape=shape))
    varied = dataclasses.replace(uniform, n_head_kv_per_layer=(2, 1, 2))
    status = gguf_info(varied).model_dump(mode="json", by_alias=True)
    assert status["headCountKVPerLayer"] == [2, 1, 2]
    model = model_facts(GGUFInfo.model_validate(status))
    assert model.n_head_kv == 2 and model.n_head_kv_per_layer == (2, 1, 2)
    envelope = RuntimeEnvelope(context_size=512)
    full = kv_cache_bytes(model=model_facts(gguf_info(uniform)), envelope=envelope)
    assert kv_cache_bytes(model=model, envelope=envelope) * 6 == full * 5
    with pytest.raises(ArtifactNotUsable, match="headCountKVPerLayer has 2 entries for 3"):
        model_facts(gguf_info(dataclasses.replace(uniform, n_head_kv_per_layer=(2, 1))))


# ---------------------------------------------------------------------------
# Kubernetes quantities and nodes


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("64", Fraction(64)),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("512Gi", Fraction(512 * 2**30)),
        ("81559Mi", Fraction(81559 * 2**20)),
        ("2113442844Ki", Fraction(2113442844 * 1024)),
        ("1e3", Fraction(1000)),
        ("1E", Fraction(10**18)),
        ("2k", Fraction(2000)),
        ("0.5Gi", Fraction(2**29)),
        ("100u", Fraction(1, 10**4)),
        (".5", Fraction(1, 2)),
    ],
    ids=lambda v: str(v),
)
def test_parse_quantity(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1.2.3", "1 Gi", "1KiB", "1e", "ten"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_cpu_and_bytes_round_up() -> None:
    assert parse_cpu_millicores("64") == 64000
    assert parse_cpu_millicores("191500m") == 191500
    assert parse_cpu_millicores("100u") == 1
    assert parse_bytes("81559Mi") == 85520809984
    assert parse_bytes("1.5") == 2
    assert parse_bytes(1024) == 1024
    with pytest.raises(ValueError, match="negative"):
        parse_bytes("-1Gi")


H100_NODE_JSON: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "gpu-node-7",
        "labels": {
            "kubernetes.io/hostname": "gpu-node-7",
            "node.kubernetes.io/instance-type": "p5.48xlarge",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.family": "hopper",
            "nvidia.com/gpu.memory": "81559",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.present": "true",
        },
    },
    "spec": {
        "providerID": "aws:///us-east-1a/i-0123",
        "taints": [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "example.com/maintenance", "effect": "PreferNoSchedule"},
        ],
    },
    "status": {
        "capacity": {"cpu": "192", "memory": "2113542844Ki", "nvidia.com/gpu": "8"},
        "allocatable": {
            "cpu": "191450m",
            "ephemeral-storage": "27Ti",
            "hugepages-1Gi": "0",
            "memory": "2048Gi",
            "nvidia.com/gpu": "8",
            "pods": "110",
        },
    },
}


def test_node_from_k8s_realistic() -> None:
    node = node_from_k8s(H100_NODE_JSON)
    assert node.name == "gpu-node-7"
    assert node.cpu_millicores == 191450 and node.memory_bytes == 2048 * GIB
    (gpus,) = node.gpus
    assert (gpus.resource, gpus.count, gpus.combinable) == ("nvidia.com/gpu", 8, True)
    assert gpus.product == "NVIDIA-H100-80GB-HBM3" and gpus.memory_bytes == H100_MIB * MIB
    assert node.taints == (
        ("nvidia.com/gpu", "present", "NoSchedule"),
        ("example.com/maintenance", "", "PreferNoSchedule"),
    )
    assert node.labels["nvidia.com/gpu.family"] == "hopper"
    envelope = RuntimeEnvelope(context_size=8192, concurrency=2)
    plan = plan_placement(model=M34, envelope=envelope, placement=Placement(), nodes=(node,))
    _assert_envelope_echoed(plan, envelope)
    assert plan.selected is None and plan.fit_failed_message is not None
    assert "untolerated taint nvidia.com/gpu=present:NoSchedule" in plan.fit_failed_message
    tolerant = Placement(tolerations=(("nvidia.com/gpu", "Equal", "present", ""),))
    plan = plan_placement(model=M34, envelope=envelope, placement=tolerant, nodes=(node,))
    _assert_envelope_echoed(plan, envelope)
    assert plan.selected is not None and plan.selected.gpus_per_replica == 1


def test_node_from_k8s_cpu_node_cordoned() -> None:
    node = node_from_k8s(
        {
            "metadata": {"name": "cpu-1"},
            "spec": {"unschedulable": True},
            "status": {"allocatable": {"cpu": "4", "memory": "16Gi"}},
        }
    )
    assert node.gpus == () and not node.has_gpus
    assert node.taints == (("node.kubernetes.io/unschedulable", "", "NoSchedule"),)
    plan = plan_placement(model=M7, envelope=CTX4K, placement=Placement(), nodes=(node,))
    _assert_envelope_echoed(plan, CTX4K)
    assert plan.fit_failed_message is not None
    assert "node.kubernetes.io/unschedulable:NoSchedule" in plan.fit_failed_message


def test_node_from_k8s_rejects_nameless() -> None:
    with pytest.raises(ValueError, match=r"metadata\.name"):
        node_from_k8s({"status": {"allocatable": {"cpu": "1"}}})


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        (("nvidia.com/gpu", "Exists", "", ""), True),
        (("nvidia.com/gpu", "Equal", "present", "NoSchedule"), True),
        (("nvidia.com/gpu", "", "present", ""), True),
        (("", "Exists", "", ""), True),
        (("nvidia.com/gpu", "Equal", "absent", ""), False),
        (("nvidia.com/gpu", "Exists", "", "NoExecute"), False),
        (("other", "Exists", "", ""), False),
    ],
    ids=["exists", "equal", "default-op", "wildcard", "wrong-value", "wrong-effect", "wrong-key"],
)
def test_tolerations(toleration: tuple[str, str, str, str], tolerated: bool) -> None:
    plan = plan_placement(
        model=M7,
        envelope=CTX4K,
        placement=Placement(tolerations=(toleration,)),
        nodes=(TAINTED_H100,),
    )
    _assert_envelope_echoed(plan, CTX4K)
    assert (plan.selected is not None) == tolerated


# ---------------------------------------------------------------------------
# llama-server flags


def llama_server_args(profile: Profile, *, model_dir: str, host: str, port: int) -> list[str]:
    """The flags a serving pod runs ``profile`` with: the production path, via ServingPlan."""
    plan = serving_plan(profile=profile, entrypoint="m.gguf", manifest_digest="")
    return plan.llama_server_args(model_dir=model_dir, host=host, port=port)


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_args_multi_gpu() -> None:
    envelope = RuntimeEnvelope(
        context_size=8192,
        concurrency=4,
        kv_key_type=KVCacheType.Q8_0,
        kv_value_type=KVCacheType.Q8_0,
        batch_size=1024,
        micro_batch_size=256,
        flash_attention=FlashAttention.ON,
        threads=8,
    )
    plan = plan_placement(model=M34, envelope=envelope, placement=Placement(), nodes=(L4X4,))
    _assert_envelope_echoed(plan, envelope)
    profile = plan.selected
    assert profile is not None and profile.gpus_per_replica == 4
    args = llama_server_args(profile, model_dir="/models", host="10.1.2.3", port=8080)
    assert args[:6] == ["--model", "/models/m.gguf", "--host", "10.1.2.3", "--port", "8080"]
    assert _flag(args, "--ctx-size") == str(8192 * 4)
    assert _flag(args, "--parallel") == "4"
    assert (_flag(args, "--cache-type-k"), _flag(args, "--cache-type-v")) == ("q8_0", "q8_0")
    assert _flag(args, "--n-gpu-layers") == "49"
    assert _flag(args, "--split-mode") == "layer"
    assert _flag(args, "--tensor-split") == "1,1,1,1"
    assert (_flag(args, "--batch-size"), _flag(args, "--ubatch-size")) == ("1024", "256")
    assert _flag(args, "--flash-attn") == "on"
    assert _flag(args, "--threads") == "8"
    assert _flag(args, "--fit") == "off"
    for flag in ("--metrics", "--slots", "--no-context-shift", "--no-kv-unified"):
        assert flag in args


def test_args_single_gpu_and_cpu() -> None:
    plan = plan_placement(model=M7, envelope=CTX4K, placement=Placement(), nodes=(L4X1,))
    assert plan.selected is not None
    args = llama_server_args(plan.selected, model_dir="/m", host="h", port=1)
    assert _flag(args, "--split-mode") == "none" and "--tensor-split" not in args
    assert _flag(args, "--flash-attn") == "auto" and "--threads" not in args
    assert _flag(args, "--ctx-size") == "4096"
    cpu = plan_placement(
        model=M7, envelope=CTX4K, placement=Placement(mode=PlacementMode.CPU), nodes=(L4X1,)
    )
    assert cpu.selected is not None
    args = llama_server_args(cpu.selected, model_dir="/m", host="h", port=1)
    assert _flag(args, "--n-gpu-layers") == "0" and "--split-mode" not in args
