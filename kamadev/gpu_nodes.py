"""What NVIDIA's device plugin and GPU Feature Discovery publish on a GPU node, as data.

No GPU is available where Kama is developed, so the planner's tests and the local
stack's fake GPU nodes (``LocalStack.add_gpu_node``) label Node objects the way GFD
would on a real one: whole cards, time-sliced or MPS cards, MIG with the ``mixed`` or
the ``single`` strategy, or a node whose GFD published no memory. Label names and
values follow NVIDIA/k8s-device-plugin (``docs/gfd_labels.md``,
``internal/lm/resource.go``, ``internal/lm/mig-strategy.go``); ``kama.accelerators``
reads them back. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Published",
    "mig_mixed",
    "mig_single",
    "node_object",
    "shared_gpus",
    "whole_gpus",
]


@dataclass(frozen=True, kw_only=True)
class Published:
    """A node's GPU labels and its allocatable GPU resources (quantities as strings)."""

    labels: dict[str, str] = field(default_factory=dict)
    allocatable: dict[str, str] = field(default_factory=dict)


def _resource_labels(
    *,
    resource: str,
    product: str,
    count: int,
    memory_mib: int | None,
    replicas: int = 1,
    strategy: str = "none",
) -> dict[str, str]:
    labels = {
        f"{resource}.product": product,
        f"{resource}.count": str(count),
        f"{resource}.replicas": str(replicas),
        f"{resource}.sharing-strategy": strategy,
    }
    if memory_mib is not None:
        labels[f"{resource}.memory"] = str(memory_mib)
    return labels


def whole_gpus(*, product: str, memory_mib: int | None, count: int) -> Published:
    """``count`` whole cards; ``memory_mib`` None: GFD published no memory label."""
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/mig.capable": "false",
        **_resource_labels(
            resource="nvidia.com/gpu", product=product, count=count, memory_mib=memory_mib
        ),
    }
    return Published(labels=labels, allocatable={"nvidia.com/gpu": str(count)})


def shared_gpus(
    *,
    product: str,
    memory_mib: int,
    count: int,
    replicas: int,
    strategy: str = "time-slicing",
    rename_by_default: bool = False,
) -> Published:
    """``count`` cards, each handed out as ``replicas`` slices (``strategy`` is
    ``time-slicing`` or ``mps``): ``count * replicas`` allocatable, as
    ``nvidia.com/gpu.shared`` with ``renameByDefault``, else as ``nvidia.com/gpu`` with
    the product suffixed ``-SHARED``."""
    shown = product if rename_by_default else f"{product}-SHARED"
    resource = "nvidia.com/gpu.shared" if rename_by_default else "nvidia.com/gpu"
    labels = {
        "nvidia.com/gpu.present": "true",
        **_resource_labels(
            resource="nvidia.com/gpu",
            product=shown,
            count=count,
            memory_mib=memory_mib,
            replicas=replicas,
            strategy=strategy,
        ),
    }
    return Published(labels=labels, allocatable={resource: str(count * replicas)})


def mig_mixed(
    *,
    product: str,
    memory_mib: int,
    cards: int,
    profiles: Mapping[str, tuple[int, int]],
) -> Published:
    """``cards`` MIG-enabled cards under the ``mixed`` strategy, partitioned into
    ``profiles`` (``{"1g.10gb": (count, memory_mib)}``): each profile its own resource
    ``nvidia.com/mig-<profile>``; no whole card is allocatable."""
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed",
        # the MIG-enabled cards themselves, labelled without sharing (replicas 0)
        **_resource_labels(
            resource="nvidia.com/gpu",
            product=product,
            count=cards,
            memory_mib=memory_mib,
            replicas=0,
        ),
    }
    allocatable = {"nvidia.com/gpu": "0"}
    for profile, (count, profile_mib) in profiles.items():
        resource = f"nvidia.com/mig-{profile}"
        labels |= _resource_labels(
            resource=resource,
            product=f"{product}-MIG-{profile}",
            count=count,
            memory_mib=profile_mib,
        )
        labels[f"{resource}.slices.gi"] = profile.split("g.", 1)[0].split(".")[-1]
        allocatable[resource] = str(count)
    return Published(labels=labels, allocatable=allocatable)


def mig_single(*, product: str, profile: str, memory_mib: int, count: int) -> Published:
    """MIG under the ``single`` strategy: ``nvidia.com/gpu`` counts ``count`` instances
    of one ``profile``, and its labels describe an instance, not a card."""
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        **_resource_labels(
            resource="nvidia.com/gpu",
            product=f"{product}-MIG-{profile}",
            count=count,
            memory_mib=memory_mib,
        ),
        "nvidia.com/gpu.slices.gi": profile.split("g.", 1)[0].split(".")[-1],
    }
    return Published(labels=labels, allocatable={"nvidia.com/gpu": str(count)})


def node_object(
    *,
    name: str,
    published: Published | None = None,
    cpu: str = "64",
    memory: str = "512Gi",
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """A Node as the API server returns it, with ``published``'s labels and allocatable."""
    published = published or Published()
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110", **published.allocatable}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **published.labels, **(labels or {})},
        },
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {"capacity": dict(allocatable), "allocatable": allocatable},
    }
