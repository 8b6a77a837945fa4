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

Pure: no I/O. The question and answer are in ``kama.placement_plan``, the candidates
per node in ``kama.placement_candidates``, the FitFailed and Degraded messages in
``kama.placement_messages``. The memory estimate lives in ``kama.memory``, what the planner knows of
nodes in ``kama.node_inventory`` and ``kama.accelerators``; ``kama.deployment_plan``
turns the chosen profile into the ``ServingPlan`` whose llama-server flags the runtime
supervisor renders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from kama.api.deployment_choices import PlacementMode, PlacementPolicy
from kama.memory import RuntimeEnvelope
from kama.model_facts import ModelFacts
from kama.node_inventory import NodeInventory, Taint
from kama.placement_candidates import Candidate, cpu_candidate, gpu_candidates
from kama.placement_messages import degraded_reason, fit_failed_message
from kama.placement_plan import (
    Placement,
    PlacementPlan,
    Profile,
    ProfileMode,
    Rejection,
    ResourceName,
    SplitMode,
    Toleration,
)

__all__ = ["MIN_REPLICA_CPU_MILLICORES", "plan_placement"]

MIN_REPLICA_CPU_MILLICORES: Final = 1000
"""CPU a replica needs when ``threads`` is not set; with ``threads`` it is 1000 per thread."""

_EXCLUDING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})


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


_FAMILY: Final[Mapping[ProfileMode, int]] = MappingProxyType(
    {ProfileMode.GPU: 0, ProfileMode.HYBRID: 1, ProfileMode.CPU: 2}
)


def _rank(*, candidate: Candidate, policy: PlacementPolicy, concurrency: int) -> tuple[Any, ...]:
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
    fits: list[Candidate] = []
    for node in sorted(nodes, key=lambda n: n.name):
        exclusion = _node_exclusion(node=node, placement=placement, envelope=envelope)
        if exclusion is not None:
            rejected.append(exclusion)
            continue
        if placement.mode is not PlacementMode.CPU:
            gpu_candidates(
                node=node,
                model=model,
                envelope=envelope,
                placement=placement,
                fits=fits,
                rejected=rejected,
            )
        if placement.mode is not PlacementMode.GPU:
            cpu_candidate(node=node, model=model, envelope=envelope, fits=fits, rejected=rejected)
    if not fits:
        message = fit_failed_message(
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
        degraded_reason=degraded_reason(
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
