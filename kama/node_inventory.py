"""What the planner knows about the cluster's nodes, read from Kubernetes Node objects.

The planner compares a model's memory estimate against each node's allocatable RAM,
CPU and GPUs, and honours its taints and labels. This module turns a Node object (a
JSON dict, as the API server and workflow histories carry it) into a small, typed,
immutable ``NodeInventory``, so the planner never touches the raw object. GPU facts
come from the device plugin (``nvidia.com/gpu`` allocatable) and GPU Feature Discovery
labels (product, memory in MiB).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from kama.memory import MIB
from kama.quantities import parse_bytes, parse_count, parse_cpu_millicores

__all__ = [
    "GPU_MEMORY_LABEL",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "UNSCHEDULABLE_TAINT_KEY",
    "NodeInventory",
    "Taint",
    "node_from_k8s",
]

GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"  # MiB, from GPU Feature Discovery
UNSCHEDULABLE_TAINT_KEY: Final = "node.kubernetes.io/unschedulable"

Taint = tuple[str, str, str]
"""(key, value, effect); an absent value is ""."""


@dataclass(frozen=True, kw_only=True)
class NodeInventory:
    """What the planner knows about one node: allocatable resources, GPUs, taints, labels."""

    name: str
    cpu_millicores: int
    memory_bytes: int
    gpu_count: int = 0
    gpu_product: str | None = None
    gpu_memory_mib: int | None = None
    taints: tuple[Taint, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("cpu_millicores", "memory_bytes", "gpu_count"):
            if getattr(self, name) < 0:
                raise ValueError(f"NodeInventory.{name} must be >= 0, got {getattr(self, name)}")
        if self.gpu_memory_mib is not None and self.gpu_memory_mib < 1:
            raise ValueError(f"NodeInventory.gpu_memory_mib must be >= 1: {self.gpu_memory_mib}")
        object.__setattr__(self, "taints", tuple(self.taints))
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    @property
    def gpu_memory_bytes(self) -> int | None:
        return None if self.gpu_memory_mib is None else self.gpu_memory_mib * MIB


def _mapping(*, value: object, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} should be an object, got {type(value).__name__}")
    return value


def node_from_k8s(node: Mapping[str, Any]) -> NodeInventory:
    """Build a NodeInventory from a Kubernetes Node object given as a JSON dict.

    Reads ``status.allocatable`` (cpu, memory, ``nvidia.com/gpu``), the GFD labels
    ``nvidia.com/gpu.product`` and ``nvidia.com/gpu.memory`` (MiB), ``spec.taints`` and
    ``spec.unschedulable`` (a cordoned node counts as tainted NoSchedule).
    """
    metadata = _mapping(value=node.get("metadata"), what="metadata")
    spec = _mapping(value=node.get("spec"), what="spec")
    status = _mapping(value=node.get("status"), what="status")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("Node has no metadata.name")
    labels = {
        str(k): str(v) for k, v in _mapping(value=metadata.get("labels"), what="labels").items()
    }
    allocatable = _mapping(value=status.get("allocatable"), what="status.allocatable")
    gpu_count = parse_count(allocatable.get(GPU_RESOURCE, 0))
    gpu_memory = labels.get(GPU_MEMORY_LABEL)
    taints: list[Taint] = []
    for raw in spec.get("taints") or ():
        taint = _mapping(value=raw, what="taint")
        key, effect = taint.get("key"), taint.get("effect")
        if not isinstance(key, str) or not isinstance(effect, str):
            raise ValueError(f"Node {name} has a taint without key or effect: {raw!r}")
        taints.append((key, str(taint.get("value") or ""), effect))
    if spec.get("unschedulable") and not any(t[0] == UNSCHEDULABLE_TAINT_KEY for t in taints):
        taints.append((UNSCHEDULABLE_TAINT_KEY, "", "NoSchedule"))
    return NodeInventory(
        name=name,
        cpu_millicores=parse_cpu_millicores(allocatable.get("cpu", 0)),
        memory_bytes=parse_bytes(allocatable.get("memory", 0)),
        gpu_count=gpu_count,
        gpu_product=labels.get(GPU_PRODUCT_LABEL),
        gpu_memory_mib=int(gpu_memory) if gpu_memory and gpu_memory.isdigit() else None,
        taints=tuple(taints),
        labels=labels,
    )
