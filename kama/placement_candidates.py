"""The candidates the placement planner weighs on one node: the whole model on 1..N
devices of each kind of GPU the node offers, hybrid (the most layers that fit, the
rest on the host) where the whole model does not, and CPU only; each with its memory
estimate, kept when it fits the node and rejected with numbers when not.

Pure: no I/O. ``kama.planner`` chooses among what fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kama.accelerators import VENDORS, DeviceKind, Sharing
from kama.api.deployment_choices import PlacementMode
from kama.memory import MemoryEstimate, RuntimeEnvelope, estimate_memory, format_bytes
from kama.model_facts import ModelFacts
from kama.node_inventory import NodeInventory
from kama.placement_plan import Placement, ProfileMode, Rejection, ResourceName

__all__ = ["Candidate", "cpu_candidate", "gpu_candidates"]


@dataclass(frozen=True, kw_only=True)
class Candidate:
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


def _tensor_split(*, kind: DeviceKind, gpus: int) -> tuple[int, ...]:
    """Proportions by GPU memory (the devices of one kind are alike), reduced: (1, 1, ...)."""
    if gpus < 2:
        return ()
    memory = [kind.memory_bytes or 1] * gpus
    divisor = math.gcd(*memory)
    return tuple(m // divisor for m in memory)


def _memory_rejection(*, candidate: Candidate) -> Rejection | None:
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


def gpu_candidates(
    *,
    node: NodeInventory,
    model: ModelFacts,
    envelope: RuntimeEnvelope,
    placement: Placement,
    fits: list[Candidate],
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
    fits: list[Candidate],
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

    def candidate(mode: ProfileMode, gpus: int, layers: int) -> Candidate:
        split = _tensor_split(kind=kind, gpus=gpus)
        estimate = estimate_memory(
            model=model, envelope=envelope, n_gpu_layers=layers, gpus=gpus, tensor_split=split
        )
        return Candidate(
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
    make: Callable[[ProfileMode, int, int], Candidate],
    fits: list[Candidate],
    rejected: list[Rejection],
    mode: PlacementMode,
) -> None:
    """The hybrid candidate on ``gpus`` GPUs with the most layers whose VRAM fits."""
    best: Candidate | None = None
    last: Candidate | None = None
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


def cpu_candidate(
    *,
    node: NodeInventory,
    model: ModelFacts,
    envelope: RuntimeEnvelope,
    fits: list[Candidate],
    rejected: list[Rejection],
) -> None:
    cand = Candidate(
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
