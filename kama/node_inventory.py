"""What the planner knows about the cluster's nodes, read from Kubernetes Node objects.

The planner compares a model's memory estimate against each node's allocatable RAM,
CPU and GPUs, and honours its taints and labels. This module turns a Node object (a
JSON dict, as the API server and workflow histories carry it) into a small, typed,
immutable ``NodeInventory``, so the planner never touches the raw object. GPU facts
come from the device plugin's allocatable resources and GPU Feature Discovery labels,
read by ``kama.accelerators`` into the kinds of device a pod can request there (whole
cards, time-sliced or MPS slices, MIG instances).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from kama.accelerators import (
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    DeviceKind,
    device_kinds,
)
from kama.quantities import parse_bytes, parse_cpu_millicores

__all__ = [
    "GPU_MEMORY_LABEL",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "UNSCHEDULABLE_TAINT_KEY",
    "DeviceKind",
    "NodeInventory",
    "Taint",
    "node_from_k8s",
]

UNSCHEDULABLE_TAINT_KEY: Final = "node.kubernetes.io/unschedulable"

Taint = tuple[str, str, str]
"""(key, value, effect); an absent value is ""."""


@dataclass(frozen=True, kw_only=True)
class NodeInventory:
    """What the planner knows about one node: allocatable resources, the kinds of GPU
    device it offers, taints, labels."""

    name: str
    cpu_millicores: int
    memory_bytes: int
    gpus: tuple[DeviceKind, ...] = ()
    taints: tuple[Taint, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("cpu_millicores", "memory_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"NodeInventory.{name} must be >= 0, got {getattr(self, name)}")
        object.__setattr__(self, "gpus", tuple(self.gpus))
        object.__setattr__(self, "taints", tuple(self.taints))
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    @property
    def has_gpus(self) -> bool:
        return any(kind.count for kind in self.gpus)


def _mapping(*, value: object, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} should be an object, got {type(value).__name__}")
    return value


def node_from_k8s(node: Mapping[str, Any]) -> NodeInventory:
    """Build a NodeInventory from a Kubernetes Node object given as a JSON dict.

    Reads ``status.allocatable`` (cpu, memory, the GPU resources), the GFD labels
    (``kama.accelerators``), ``spec.taints`` and ``spec.unschedulable`` (a cordoned
    node counts as tainted NoSchedule).
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
        gpus=device_kinds(labels=labels, allocatable=allocatable),
        taints=tuple(taints),
        labels=labels,
    )
