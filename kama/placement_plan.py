"""The placement planner's question and answer: a deployment's placement intent
(``Placement``), the resolved profile of one replica (``Profile``), the candidates
rejected and why (``Rejection``), and the plan that holds them (``PlacementPlan``).
``kama.planner`` computes the plan; ``kama.deployment_plan`` turns its profile into a
ServingPlan and conditions.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Literal

from kama.accelerators import DeviceKind
from kama.api.deployment_choices import PlacementMode, PlacementPolicy
from kama.memory import MemoryEstimate, RuntimeEnvelope

__all__ = [
    "Placement",
    "PlacementPlan",
    "Profile",
    "ProfileMode",
    "Rejection",
    "ResourceName",
    "SplitMode",
    "Toleration",
]

Toleration = tuple[str, str, str, str]
"""(key, operator, value, effect) as in a Pod spec; "" for an absent field, operator
"Equal" or "Exists" ("" means Equal); an empty effect matches every effect."""

ResourceName = Literal["memory", "gpu-memory", "gpus", "cpu", "artifact", "node", "mode"]


class ProfileMode(StrEnum):
    CPU = "CPU"
    GPU = "GPU"
    HYBRID = "Hybrid"


class SplitMode(StrEnum):
    NONE = "none"
    LAYER = "layer"


@dataclass(frozen=True, kw_only=True)
class Placement:
    """The deployment's placement intent."""

    mode: PlacementMode = PlacementMode.AUTO
    policy: PlacementPolicy = PlacementPolicy.BALANCED
    max_gpus_per_replica: int | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    allowed_nodes: frozenset[str] | None = None
    """Nodes that can mount the artifact (e.g. the node of a Direct RWO local PV); None = all."""

    def __post_init__(self) -> None:
        if self.max_gpus_per_replica is not None and self.max_gpus_per_replica < 1:
            raise ValueError(
                f"Placement.max_gpus_per_replica must be >= 1, got {self.max_gpus_per_replica}"
            )
        for key, operator, value, _effect in self.tolerations:
            if operator not in ("", "Equal", "Exists"):
                raise ValueError(f"toleration {key!r} has unknown operator {operator!r}")
            if operator == "Exists" and value:
                raise ValueError(f"toleration {key!r} with operator Exists must have no value")
            if not key and operator != "Exists":
                raise ValueError("a toleration with an empty key must use operator Exists")
        object.__setattr__(self, "tolerations", tuple(self.tolerations))
        object.__setattr__(self, "node_selector", MappingProxyType(dict(self.node_selector)))


@dataclass(frozen=True, kw_only=True)
class Rejection:
    """A candidate (or a whole node, ``mode`` None) that was not chosen, and why.

    ``required`` and ``available`` are in the unit of ``resource``: bytes for memory
    and gpu-memory (per GPU), a count for gpus, millicores for cpu; None when the
    reason is not a quantity (a taint, a selector, the artifact's location).
    """

    node: str
    mode: ProfileMode | None
    gpus: int
    n_gpu_layers: int
    resource: ResourceName
    reason: str
    required: int | None = None
    available: int | None = None
    unit: str = "GPU(s)"
    """The devices ``gpus`` counts: whole cards, or the resource of a slice kind."""

    @property
    def candidate(self) -> str:
        if self.mode is None:
            return "node"
        if self.mode is ProfileMode.CPU:
            return "CPU"
        if self.gpus == 0:
            return str(self.mode)
        return f"{self.mode} on {self.gpus} {self.unit}, {self.n_gpu_layers} GPU layers"

    def describe(self) -> str:
        return f"{self.node} ({self.candidate}): {self.reason}"


@dataclass(frozen=True, kw_only=True)
class Profile:
    """The resolved placement of one replica. ``envelope`` is the request, unchanged."""

    mode: ProfileMode
    node: str
    gpus_per_replica: int
    gpu_product: str | None
    n_gpu_layers: int
    total_layers: int  # n_layer + 1: the repeating layers and the output layer
    split_mode: SplitMode
    tensor_split: tuple[int, ...]
    context_per_slot: int
    ram_bytes: int
    ram_available_bytes: int
    vram_bytes_per_gpu: int
    vram_available_bytes_per_gpu: int
    cpu_millicores: int
    estimate: MemoryEstimate
    envelope: RuntimeEnvelope
    decision: Literal["Estimated", "Profiled"] = "Estimated"
    degraded_reason: str | None = None
    device: DeviceKind | None = None
    """The kind of GPU device each replica requests ``gpus_per_replica`` of; None on CPU."""

    @property
    def ctx_total(self) -> int:
        return self.context_per_slot * self.envelope.concurrency


@dataclass(frozen=True, kw_only=True)
class PlacementPlan:
    """The planner's answer: a profile, or None with ``fit_failed_message``."""

    selected: Profile | None
    rejected: tuple[Rejection, ...]
    fit_failed_message: str | None
    envelope: RuntimeEnvelope

    @property
    def fit_failed(self) -> bool:
        return self.selected is None
