"""The placement planner: where and how one llama-server replica of a model runs.

A ModelDeployment asks for a runtime envelope (context, slots, KV precision, batch
sizes) and a placement intent (Auto/CPU/GPU, a policy, node selector, tolerations, a
GPU cap). The planner turns that, the model's GGUF facts and the nodes' allocatable
resources into one resolved profile (DESIGN §5): which node, how many GPUs, how many
layers offloaded, the layer split, and the estimated RAM/VRAM against what the node
has. It also records every candidate it rejected and why, with numbers, so that
``status`` and a ``FitFailed`` condition can say exactly what did not fit.

The envelope is a promise to the user: the planner never lowers context, slots or KV
precision to make a model fit. It changes only where the model runs; if nothing
fits, the answer is FitFailed and no pod is created.

GPUs are read as the cluster publishes them (``kama.accelerators``): each node offers
kinds of device, each with its own resource name, count and memory per device.
Whole cards may be combined, a replica splitting layers over 1..N of them. A
time-sliced or MPS slice of a card counts the card's memory divided by its replicas
(any slice may go to another pod), and a MIG instance its own memory; of either a
replica takes exactly one, since two slices may be one card and a CUDA process uses
one MIG instance. The chosen profile names the resource its pods request and the
label that pins the product.

Pure: no I/O. The memory estimate lives in ``kama.memory``, what the planner knows of
nodes in ``kama.node_inventory`` and ``kama.accelerators``; ``kama.deployment_plan``
turns the chosen profile into the ``ServingPlan`` whose llama-server flags the runtime
supervisor renders.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Final, Literal

from kama.accelerators import VENDORS, DeviceKind, Sharing
from kama.api.deployment_choices import PlacementMode, PlacementPolicy
from kama.memory import (
    MemoryEstimate,
    RuntimeEnvelope,
    estimate_memory,
    format_bytes,
)
from kama.model_facts import ModelFacts
from kama.node_inventory import NodeInventory, Taint

__all__ = [
    "MIN_REPLICA_CPU_MILLICORES",
    "Placement",
    "PlacementPlan",
    "Profile",
    "ProfileMode",
    "Rejection",
    "ResourceName",
    "SplitMode",
    "Toleration",
    "plan_placement",
]

MIN_REPLICA_CPU_MILLICORES: Final = 1000
"""CPU a replica needs when ``threads`` is not set; with ``threads`` it is 1000 per thread."""

_EXCLUDING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})

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


# ---------------------------------------------------------------------------
# Request and result


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


# ---------------------------------------------------------------------------
# The planner


@dataclass(frozen=True, kw_only=True)
class _Candidate:
    node: NodeInventory
    kind: DeviceKind | None  # None: CPU
    mode: ProfileMode
    gpus: int
    n_gpu_layers: int
    tensor_split: tuple[int, ...]
    estimate: MemoryEstimate

    @property
    def vram_per_gpu(self) -> int:
        return (self.kind.memory_bytes or 0) if self.kind is not None else 0

    @property
    def vram_headroom(self) -> int:
        available = self.vram_per_gpu
        return min((available - v for v in self.estimate.vram_bytes_by_gpu), default=0)

    @property
    def ram_headroom(self) -> int:
        return self.node.memory_bytes - self.estimate.ram_bytes


def _tolerates(*, toleration: Toleration, taint: Taint) -> bool:
    key, operator, value, effect = toleration
    taint_key, taint_value, taint_effect = taint
    if effect and effect != taint_effect:
        return False
    if operator == "Exists":
        return not key or key == taint_key
    return key == taint_key and value == taint_value


def _required_cpu(*, envelope: RuntimeEnvelope) -> int:
    return 1000 * envelope.threads if envelope.threads else MIN_REPLICA_CPU_MILLICORES


def _node_exclusion(
    *, node: NodeInventory, placement: Placement, envelope: RuntimeEnvelope
) -> Rejection | None:
    """Why no candidate at all can run on ``node``, or None."""

    def reject(
        resource: ResourceName,
        reason: str,
        required: int | None = None,
        available: int | None = None,
    ) -> Rejection:
        return Rejection(
            node=node.name,
            mode=None,
            gpus=0,
            n_gpu_layers=0,
            resource=resource,
            reason=reason,
            required=required,
            available=available,
        )

    if placement.allowed_nodes is not None and node.name not in placement.allowed_nodes:
        where = ", ".join(sorted(placement.allowed_nodes)) or "no node"
        return reject("artifact", f"cannot mount the artifact, which is reachable only on {where}")
    for key, wanted in sorted(placement.node_selector.items()):
        actual = node.labels.get(key)
        if actual != wanted:
            has = "absent" if actual is None else repr(actual)
            return reject("node", f"node selector {key}={wanted} does not match (label {has})")
    for taint in node.taints:
        if taint[2] in _EXCLUDING_EFFECTS and not any(
            _tolerates(toleration=t, taint=taint) for t in placement.tolerations
        ):
            key, value, effect = taint
            shown = f"{key}={value}:{effect}" if value else f"{key}:{effect}"
            return reject("node", f"untolerated taint {shown}")
    need_cpu = _required_cpu(envelope=envelope)
    if need_cpu > node.cpu_millicores:
        return reject(
            "cpu",
            f"needs {need_cpu}m CPU, node has {node.cpu_millicores}m allocatable",
            required=need_cpu,
            available=node.cpu_millicores,
        )
    return None


def _tensor_split(*, kind: DeviceKind, gpus: int) -> tuple[int, ...]:
    """Proportions by GPU memory (the devices of one kind are alike), reduced: (1, 1, ...)."""
    if gpus < 2:
        return ()
    memory = [kind.memory_bytes or 1] * gpus
    divisor = math.gcd(*memory)
    return tuple(m // divisor for m in memory)


def _memory_rejection(*, candidate: _Candidate) -> Rejection | None:
    """The first resource ``candidate`` exceeds on its node, or None if it fits."""
    node, est, kind = candidate.node, candidate.estimate, candidate.kind
    common: dict[str, Any] = {
        "node": node.name,
        "mode": candidate.mode,
        "gpus": candidate.gpus,
        "n_gpu_layers": candidate.n_gpu_layers,
    }
    if kind is not None:
        common["unit"] = kind.unit
    available_vram = candidate.vram_per_gpu
    if kind is not None and candidate.gpus and est.vram_bytes_per_gpu > available_vram:
        return Rejection(
            **common,
            resource="gpu-memory",
            reason=(
                f"needs {format_bytes(est.vram_bytes_per_gpu)} VRAM per GPU, "
                f"{kind.describe_memory()}"
            ),
            required=est.vram_bytes_per_gpu,
            available=available_vram,
        )
    if est.ram_bytes > node.memory_bytes:
        return Rejection(
            **common,
            resource="memory",
            reason=(
                f"needs {format_bytes(est.ram_bytes)} RAM, node has "
                f"{format_bytes(node.memory_bytes)} allocatable"
            ),
            required=est.ram_bytes,
            available=node.memory_bytes,
        )
    return None


def _gpu_candidates(
    *,
    node: NodeInventory,
    model: ModelFacts,
    envelope: RuntimeEnvelope,
    placement: Placement,
    fits: list[_Candidate],
    rejected: list[Rejection],
) -> None:
    """The GPU candidates of every kind of device ``node`` offers."""
    kinds = [kind for kind in node.gpus if kind.count]
    if not kinds:
        if placement.mode is PlacementMode.GPU:
            resources = " or ".join(vendor.resource for vendor in VENDORS)
            rejected.append(
                Rejection(
                    node=node.name,
                    mode=ProfileMode.GPU,
                    gpus=0,
                    n_gpu_layers=0,
                    resource="gpus",
                    reason=f"node has no {resources} allocatable",
                    required=1,
                    available=0,
                )
            )
        return
    for kind in kinds:
        _kind_candidates(
            node=node,
            kind=kind,
            model=model,
            envelope=envelope,
            placement=placement,
            fits=fits,
            rejected=rejected,
        )


def _kind_candidates(
    *,
    node: NodeInventory,
    kind: DeviceKind,
    model: ModelFacts,
    envelope: RuntimeEnvelope,
    placement: Placement,
    fits: list[_Candidate],
    rejected: list[Rejection],
) -> None:
    """Whole-model candidates on 1..N devices of ``kind`` (N = 1 for slices and MIG
    instances), and hybrid ones where they fail."""
    full = model.n_layer + 1

    def reject(resource: ResourceName, reason: str, gpus: int = 0, layers: int = 0) -> None:
        rejected.append(
            Rejection(
                node=node.name,
                mode=ProfileMode.GPU,
                gpus=gpus,
                n_gpu_layers=layers,
                resource=resource,
                reason=reason,
                unit=kind.unit,
            )
        )

    if kind.memory_bytes is None:
        reject("gpu-memory", f"GPU memory unknown: node lacks the {kind.memory_label} label (GFD)")
        return
    cap = placement.max_gpus_per_replica or kind.count

    def candidate(mode: ProfileMode, gpus: int, layers: int) -> _Candidate:
        split = _tensor_split(kind=kind, gpus=gpus)
        estimate = estimate_memory(
            model=model, envelope=envelope, n_gpu_layers=layers, gpus=gpus, tensor_split=split
        )
        return _Candidate(
            node=node,
            kind=kind,
            mode=mode,
            gpus=gpus,
            n_gpu_layers=layers,
            tensor_split=split,
            estimate=estimate,
        )

    for gpus in range(1, kind.max_per_replica + 1):
        whole = candidate(ProfileMode.GPU, gpus, full)
        problem = _memory_rejection(candidate=whole)
        if gpus > cap:
            if problem is None:  # it would fit, but only above the cap: say so once
                rejected.append(
                    Rejection(
                        node=node.name,
                        mode=ProfileMode.GPU,
                        gpus=gpus,
                        n_gpu_layers=full,
                        resource="gpus",
                        reason=f"needs {gpus} GPUs, over maxGPUsPerReplica={cap}",
                        required=gpus,
                        available=cap,
                    )
                )
                return
            continue
        if problem is None:
            fits.append(whole)
            continue
        rejected.append(problem)
        if problem.resource != "gpu-memory":
            continue  # RAM is short already; offloading fewer layers only needs more
        if not kind.combinable and kind.count > 1:
            why = (
                "two slices may be the same card"
                if kind.sharing is not Sharing.NONE
                else "a CUDA process uses one MIG instance"
            )
            reject(
                "gpus",
                f"no layer split over {kind.count} allocatable {kind.resource}: a replica "
                f"takes one, because {why}",
                gpus=2,
                layers=full,
            )
        _hybrid_candidate(
            gpus=gpus, full=full, make=candidate, fits=fits, rejected=rejected, mode=placement.mode
        )


def _hybrid_candidate(
    *,
    gpus: int,
    full: int,
    make: Callable[[ProfileMode, int, int], _Candidate],
    fits: list[_Candidate],
    rejected: list[Rejection],
    mode: PlacementMode,
) -> None:
    """The hybrid candidate on ``gpus`` GPUs with the most layers whose VRAM fits."""
    best: _Candidate | None = None
    last: _Candidate | None = None
    for layers in range(full - 1, 0, -1):
        last = make(ProfileMode.HYBRID, gpus, layers)
        problem = _memory_rejection(candidate=last)
        if problem is None or problem.resource != "gpu-memory":
            best = last
            break
    if best is None:
        if last is not None:
            problem = _memory_rejection(candidate=last)
            assert problem is not None
            rejected.append(problem)
        return
    problem = _memory_rejection(candidate=best)
    if problem is not None:
        rejected.append(problem)
    elif mode is PlacementMode.GPU:
        rejected.append(
            Rejection(
                node=best.node.name,
                mode=ProfileMode.HYBRID,
                gpus=gpus,
                n_gpu_layers=best.n_gpu_layers,
                unit=best.kind.unit if best.kind is not None else "GPU(s)",
                resource="mode",
                reason=(
                    f"would fit as hybrid with {best.n_gpu_layers} of {full} layers on GPU, "
                    "but placement.mode is GPU, which never falls back to hybrid or CPU"
                ),
            )
        )
    else:
        fits.append(best)


def _cpu_candidate(
    *,
    node: NodeInventory,
    model: ModelFacts,
    envelope: RuntimeEnvelope,
    fits: list[_Candidate],
    rejected: list[Rejection],
) -> None:
    cand = _Candidate(
        node=node,
        kind=None,
        mode=ProfileMode.CPU,
        gpus=0,
        n_gpu_layers=0,
        tensor_split=(),
        estimate=estimate_memory(model=model, envelope=envelope, n_gpu_layers=0, gpus=0),
    )
    problem = _memory_rejection(candidate=cand)
    if problem is None:
        fits.append(cand)
    else:
        rejected.append(problem)


_FAMILY: Final[Mapping[ProfileMode, int]] = MappingProxyType(
    {ProfileMode.GPU: 0, ProfileMode.HYBRID: 1, ProfileMode.CPU: 2}
)


def _rank(*, candidate: _Candidate, policy: PlacementPolicy, concurrency: int) -> tuple[Any, ...]:
    """Sort key: smaller is better. Families first: whole GPU, hybrid, CPU."""
    c = candidate
    family = _FAMILY[c.mode]
    resource = c.kind.resource if c.kind is not None else ""
    if c.mode is ProfileMode.GPU:
        if policy is PlacementPolicy.BALANCED:
            return (family, c.gpus, c.vram_headroom, c.node.name, resource)
        if policy is PlacementPolicy.LATENCY:
            return (family, c.gpus, -c.vram_headroom, c.node.name, resource)
        return (family, -min(c.gpus, concurrency), c.gpus, -c.vram_headroom, c.node.name, resource)
    if c.mode is ProfileMode.HYBRID:
        return (family, -c.n_gpu_layers, c.gpus, -c.vram_headroom, c.node.name, resource)
    # CPU: keep GPU nodes for GPU work, then the most RAM headroom.
    return (family, c.node.has_gpus, -c.ram_headroom, c.node.name)


def _closest(*, rejected: Sequence[Rejection], modes: set[ProfileMode]) -> Rejection | None:
    """The rejection among ``modes`` that missed by the smallest factor."""
    measured = [
        r
        for r in rejected
        if r.mode in modes and r.required is not None and r.available and r.resource != "gpus"
    ]
    return min(
        measured,
        key=lambda r: (Fraction(r.required or 0, r.available or 1), r.node),
        default=None,
    )


def _envelope_summary(*, model: ModelFacts, envelope: RuntimeEnvelope) -> str:
    ctx = envelope.context_per_slot(model=model)
    return (
        f"context {ctx} x {envelope.concurrency} slot(s) (--ctx-size {ctx * envelope.concurrency}),"
        f" KV {envelope.kv_key_type}/{envelope.kv_value_type}"
    )


def _fit_failed_message(
    *,
    model: ModelFacts,
    envelope: RuntimeEnvelope,
    placement: Placement,
    nodes: Sequence[NodeInventory],
    rejected: Sequence[Rejection],
) -> str:
    what = (
        f"no node fits the model ({model.file_type or 'unknown type'}, {model.n_layer} layers, "
        f"{format_bytes(model.total_weight_bytes)} of weights) with "
        f"{_envelope_summary(model=model, envelope=envelope)}; placement.mode {placement.mode}"
    )
    if not nodes:
        return f"{what}: there are no nodes"
    parts = [what]
    closest = [
        r
        for r in (
            _closest(rejected=rejected, modes={ProfileMode.GPU}),
            _closest(rejected=rejected, modes={ProfileMode.HYBRID}),
            _closest(rejected=rejected, modes={ProfileMode.CPU}),
        )
        if r is not None
    ]
    if closest:
        parts.append("closest: " + "; ".join(r.describe() for r in closest))
    other = [
        r
        for r in rejected
        if r not in closest and (r.required is None or r.resource in ("gpus", "cpu"))
    ]
    if other:
        parts.append("other reasons: " + "; ".join(r.describe() for r in other[:5]))
    if placement.mode is PlacementMode.GPU:
        parts.append("placement.mode GPU never falls back to hybrid or CPU")
    parts.append(f"{len(rejected)} candidate(s) rejected in all")
    return ". ".join(parts)


def _degraded_reason(
    *,
    chosen: _Candidate,
    placement: Placement,
    rejected: Sequence[Rejection],
    full: int,
    gpus_anywhere: bool,
) -> str | None:
    """Why the chosen placement is less than asked, or None: a whole-GPU placement
    never is, CPU is what CPU asked for, and Auto on a cluster without a GPU asked for
    nothing more than CPU (degraded means less than asked)."""
    if chosen.mode is ProfileMode.GPU or placement.mode is PlacementMode.CPU:
        return None
    if placement.mode is PlacementMode.AUTO and not gpus_anywhere:
        return None
    closest = _closest(rejected=rejected, modes={ProfileMode.GPU})
    if chosen.mode is ProfileMode.HYBRID:
        unit = chosen.kind.unit if chosen.kind is not None else "GPU(s)"
        why = f"closest whole-GPU candidate: {closest.describe()}" if closest else "none fits"
        return (
            f"hybrid: {chosen.n_gpu_layers} of {full} layers on {chosen.gpus} {unit}, the rest "
            f"on CPU, because no whole-model GPU placement fits ({why})"
        )
    if closest is not None:
        why = f"closest GPU candidate: {closest.describe()}"
    else:
        unmeasured = [r.describe() for r in rejected if r.required is None][:3]
        why = "no usable GPU node" + (f"; {'; '.join(unmeasured)}" if unmeasured else "")
    hybrid = _closest(rejected=rejected, modes={ProfileMode.HYBRID})
    if hybrid is not None:
        why += f"; closest hybrid: {hybrid.describe()}"
    return f"CPU only, because no GPU or hybrid placement fits ({why})"


def plan_placement(
    *,
    model: ModelFacts,
    envelope: RuntimeEnvelope,
    placement: Placement,
    nodes: Sequence[NodeInventory],
) -> PlacementPlan:
    """Choose where one replica runs, or say with numbers why nothing fits.

    Candidates per eligible node, in DESIGN order, for each kind of GPU device it
    offers: the whole model on 1..N devices (layer split, tensor split by GPU memory;
    N = 1 for a slice or MIG instance), hybrid on the counts where the whole model did
    not fit (the most layers that fit); then CPU only. ``placement.mode`` CPU evaluates
    only CPU; GPU only whole-model GPU (a hybrid that would fit is rejected for the
    mode). The envelope is never changed.
    """
    rejected: list[Rejection] = []
    fits: list[_Candidate] = []
    for node in sorted(nodes, key=lambda n: n.name):
        exclusion = _node_exclusion(node=node, placement=placement, envelope=envelope)
        if exclusion is not None:
            rejected.append(exclusion)
            continue
        if placement.mode is not PlacementMode.CPU:
            _gpu_candidates(
                node=node,
                model=model,
                envelope=envelope,
                placement=placement,
                fits=fits,
                rejected=rejected,
            )
        if placement.mode is not PlacementMode.GPU:
            _cpu_candidate(node=node, model=model, envelope=envelope, fits=fits, rejected=rejected)
    if not fits:
        message = _fit_failed_message(
            model=model, envelope=envelope, placement=placement, nodes=nodes, rejected=rejected
        )
        return PlacementPlan(
            selected=None, rejected=tuple(rejected), fit_failed_message=message, envelope=envelope
        )
    chosen = min(
        fits,
        key=lambda c: _rank(candidate=c, policy=placement.policy, concurrency=envelope.concurrency),
    )
    full = model.n_layer + 1
    device = chosen.kind if chosen.gpus else None
    profile = Profile(
        mode=chosen.mode,
        node=chosen.node.name,
        gpus_per_replica=chosen.gpus,
        gpu_product=device.product if device is not None else None,
        n_gpu_layers=chosen.n_gpu_layers,
        total_layers=full,
        split_mode=SplitMode.LAYER if chosen.gpus > 1 else SplitMode.NONE,
        tensor_split=chosen.tensor_split,
        context_per_slot=envelope.context_per_slot(model=model),
        ram_bytes=chosen.estimate.ram_bytes,
        ram_available_bytes=chosen.node.memory_bytes,
        vram_bytes_per_gpu=chosen.estimate.vram_bytes_per_gpu,
        vram_available_bytes_per_gpu=chosen.vram_per_gpu if chosen.gpus else 0,
        cpu_millicores=_required_cpu(envelope=envelope),
        estimate=chosen.estimate,
        envelope=envelope,
        degraded_reason=_degraded_reason(
            chosen=chosen,
            placement=placement,
            rejected=rejected,
            full=full,
            gpus_anywhere=any(node.has_gpus for node in nodes),
        ),
        device=device,
    )
    return PlacementPlan(
        selected=profile, rejected=tuple(rejected), fit_failed_message=None, envelope=envelope
    )
