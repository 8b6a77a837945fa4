"""From a ModelDeployment's spec, its artifact's status and the cluster's nodes to a
decision: the placement plan (chosen profile and every rejected candidate), the
serving template of one replica, and the status fields that report them.

This is the "pure plan" half of the DeploymentWorkflow: the workflow reads inputs
through activities, calls `decide_deployment`, and then executes. No I/O.

Where the artifact can be mounted limits where replicas go: the claim's volume node
affinity (a local PersistentVolume's node) leaves only the nodes it allows, and a
claim only one node can mount at a time (ReadWriteOnce) puts every replica on one
node: the node where a pod already mounts the claim (a replica, another deployment's,
an importer), else the node the planner picks; the template pins that node.

The conditions that summarise a decision are built here too: `Degraded` (a fallback
from what was asked, never what was asked) and `Ready` (the rule is in
`kama.api.deployment`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from kama.accelerators import GPU_PRODUCT_LABEL, GPU_RESOURCE, DeviceKind, Sharing
from kama.api import ModelArtifactStatus
from kama.api.deployment import (
    DeploymentCondition,
    MemoryBreakdown,
    ModelDeploymentSpec,
    RejectedCandidate,
    ResolvedProfile,
    Runtime,
)
from kama.api.deployment_choices import POOLED_MODES, PlacementMode, ServingMode
from kama.artifact_facts import ArtifactNotUsable, entrypoint_of, model_facts, usable
from kama.companion_plan import CompanionPlan
from kama.conditions import ConditionUpdate
from kama.durations import parse_duration
from kama.memory import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MICRO_BATCH_SIZE,
    MIB,
    DeviceEstimate,
    RuntimeEnvelope,
    format_bytes,
)
from kama.node_inventory import node_from_k8s
from kama.placement_plan import Placement, PlacementPlan, Profile, ProfileMode
from kama.planner import plan_placement
from kama.quantities import parse_bytes
from kama.reasons import DeploymentReason as R
from kama.serving_defaults import default_prompt_cache_mib, default_threads
from kama.serving_plan import ServingPlan, load_mode
from kama.serving_pod import ServingTemplate

__all__ = [
    "MAX_REJECTED_IN_STATUS",
    "SINGLE_NODE_ACCESS_MODES",
    "ArtifactNotUsable",
    "DeploymentDecision",
    "decide_deployment",
    "degraded_condition",
    "describe_profile",
    "entrypoint_of",
    "model_facts",
    "mounted_by_one_node",
    "nodes_holding_claim",
    "nodes_that_mount",
    "prompt_cache_mib",
    "runtime_envelope",
    "serving_plan",
]

MAX_REJECTED_IN_STATUS: Final = 64
SINGLE_NODE_ACCESS_MODES: Final = frozenset({"ReadWriteOnce", "ReadWriteOncePod"})


def runtime_envelope(runtime: Runtime) -> RuntimeEnvelope:
    """The envelope `runtime` asks for. In a pooled mode (embeddings, reranking) every
    input must fit one micro-batch, so both batch sizes default to the context."""
    pooled = runtime.mode in POOLED_MODES
    whole_input = runtime.context_size if pooled else None
    batch = runtime.batch_size or whole_input or DEFAULT_BATCH_SIZE
    micro = runtime.micro_batch_size or (
        min(whole_input, batch) if whole_input else min(DEFAULT_MICRO_BATCH_SIZE, batch)
    )
    return RuntimeEnvelope(
        context_size=runtime.context_size,
        concurrency=runtime.concurrency,
        kv_key_type=runtime.kv_cache.key_type,
        kv_value_type=runtime.kv_cache.value_type,
        batch_size=batch,
        micro_batch_size=micro,
        flash_attention=runtime.flash_attention,
        threads=runtime.threads,
        prompt_cache_mib=prompt_cache_mib(runtime.prompt_cache_memory),
        pooled=pooled,
    )


def prompt_cache_mib(memory: str | None) -> int | None:
    """`runtime.promptCacheMemory` in whole MiB for `--cache-ram`, rounded up so a small
    nonzero quantity never turns the cache off."""
    if memory is None:
        return None
    return -(-parse_bytes(memory) // MIB)


def serving_plan(*, profile: Profile, entrypoint: str, manifest_digest: str) -> ServingPlan:
    """The part of a profile a serving pod needs, as data for the runtime supervisor,
    which renders it as llama-server flags (``ServingPlan.llama_server_args``)."""
    envelope = profile.envelope
    return ServingPlan(
        entrypoint=entrypoint,
        manifest_digest=manifest_digest,
        ctx_total=profile.ctx_total,
        concurrency=envelope.concurrency,
        kv_key_type=str(envelope.kv_key_type),
        kv_value_type=str(envelope.kv_value_type),
        n_gpu_layers=profile.n_gpu_layers,
        gpus=profile.gpus_per_replica,
        split_mode=str(profile.split_mode),
        tensor_split=tuple(profile.tensor_split),
        batch_size=envelope.batch_size,
        micro_batch_size=envelope.micro_batch_size,
        flash_attention=str(envelope.flash_attention),
        threads=envelope.threads,
        prompt_cache_mib=envelope.prompt_cache_mib,
    )


def _requirement_matches(requirement: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key, operator = requirement.get("key", ""), requirement.get("operator", "")
    wanted = list(requirement.get("values") or [])
    if operator == "In":
        return values.get(key) in wanted
    if operator == "NotIn":
        return values.get(key) not in wanted
    if operator == "Exists":
        return key in values
    if operator == "DoesNotExist":
        return key not in values
    return False


def _term_matches(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """A core/v1 NodeSelectorTerm: all its requirements hold (labels for
    matchExpressions, `metadata.name` for matchFields); an empty term matches nothing."""
    meta = node.get("metadata", {})
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    labels = {**(meta.get("labels") or {}), "kubernetes.io/hostname": meta.get("name", "")}
    return bool(expressions or fields) and (
        all(_requirement_matches(e, labels) for e in expressions)
        and all(_requirement_matches(f, {"metadata.name": meta.get("name", "")}) for f in fields)
    )


def nodes_that_mount(
    *, affinity: Mapping[str, Any] | None, nodes: Sequence[Mapping[str, Any]]
) -> frozenset[str] | None:
    """Nodes allowed by the artifact claim's node affinity (a local PV's); None = all."""
    if not affinity:
        return None
    terms = (affinity.get("required") or {}).get("nodeSelectorTerms") or []
    if not terms:
        return None
    return frozenset(
        str(node.get("metadata", {}).get("name"))
        for node in nodes
        if any(_term_matches(term, node) for term in terms)
    )


def mounted_by_one_node(access_modes: Sequence[str]) -> bool:
    """Whether only one node at a time can mount a claim with `access_modes`: none of
    them is ReadOnlyMany or ReadWriteMany (unknown modes say nothing)."""
    return bool(access_modes) and {str(m) for m in access_modes} <= SINGLE_NODE_ACCESS_MODES


def nodes_holding_claim(*, pods: Sequence[Mapping[str, Any]], claim: str) -> list[str]:
    """The nodes where a pod that has not ended mounts `claim` (pods as the API server
    returns them)."""
    held = set()
    for pod in pods:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        node = spec.get("nodeName")
        if not node or status.get("phase") in ("Succeeded", "Failed"):
            continue
        if any(
            (volume.get("persistentVolumeClaim") or {}).get("claimName") == claim
            for volume in spec.get("volumes") or []
        ):
            held.add(str(node))
    return sorted(held)


@dataclass(frozen=True, kw_only=True)
class DeploymentDecision:
    plan: PlacementPlan
    template: ServingTemplate | None
    profile: dict[str, Any] | None  # status.profile
    rejected: list[dict[str, Any]]  # status.rejectedCandidates

    @property
    def degraded_reason(self) -> str | None:
        """Why the replica is not placed as asked: a CPU or hybrid fallback from Auto/GPU.
        CPU when `placement.mode: CPU` asks for it is not degraded."""
        selected = self.plan.selected
        return None if selected is None else selected.degraded_reason


def _sharing(device: DeviceKind | None) -> str | None:
    """How the chosen device is shared, for status: None for a whole card."""
    if device is None or device.combinable:
        return None
    if device.sharing is not Sharing.NONE:
        return f"{device.sharing}, {device.replicas} replicas per device"
    return "MIG"


def _profile_status(profile: Profile) -> dict[str, Any]:
    device = profile.device
    mode = {ProfileMode.CPU: "CPU", ProfileMode.GPU: "GPU", ProfileMode.HYBRID: "Hybrid"}
    resolved = ResolvedProfile(
        mode=mode[profile.mode],
        node=profile.node,
        gpus_per_replica=profile.gpus_per_replica,
        gpu_resource=device.resource if device is not None else None,
        gpu_sharing=_sharing(device),
        gpu_layers=profile.n_gpu_layers,
        split_mode=str(profile.split_mode) if profile.gpus_per_replica else None,
        tensor_split=[float(p) for p in profile.tensor_split],
        estimated_ram_bytes=profile.ram_bytes,
        estimated_vram_bytes_per_gpu=profile.vram_bytes_per_gpu,
        available_ram_bytes=profile.ram_available_bytes,
        available_vram_bytes_per_gpu=profile.vram_available_bytes_per_gpu or None,
        decision=profile.decision,
        host_memory=_breakdown(profile.estimate.host),
        gpu_memory=max(
            (_breakdown(g) for g in profile.estimate.gpus),
            key=lambda b: sum(b.model_dump().values()),
            default=None,
        ),
        unmodelled=profile.estimate.unmodelled,
    )
    return resolved.model_dump(mode="json", by_alias=True, exclude_none=True)


def _breakdown(device: DeviceEstimate) -> MemoryBreakdown:
    return MemoryBreakdown(
        weights_bytes=device.weights_bytes,
        kv_bytes=device.kv_bytes,
        recurrent_bytes=device.recurrent_bytes,
        compute_bytes=device.compute_bytes,
        output_bytes=device.output_bytes,
        overhead_bytes=device.overhead_bytes,
        unmodelled_bytes=device.unmodelled_bytes,
    )


def _rejected_status(plan: PlacementPlan) -> list[dict[str, Any]]:
    return [
        RejectedCandidate(
            candidate=r.candidate,
            node=r.node,
            reason=r.reason[:1024],
            required_bytes=r.required if r.resource in ("memory", "gpu-memory") else None,
            available_bytes=r.available if r.resource in ("memory", "gpu-memory") else None,
        ).model_dump(mode="json", by_alias=True, exclude_none=True)
        for r in plan.rejected[:MAX_REJECTED_IN_STATUS]
    ]


def decide_deployment(
    *,
    spec: ModelDeploymentSpec,
    artifact: ModelArtifactStatus,
    nodes: Sequence[Mapping[str, Any]],
    image: str,
    claim_nodes: Sequence[str] = (),
    draft: ModelArtifactStatus | None = None,
    adapters: Mapping[str, ModelArtifactStatus] | None = None,
) -> DeploymentDecision:
    """Plan one replica and build its template; FitFailed gives no template.

    `claim_nodes`: where pods already mount the artifact's claim: a claim one node at
    a time can mount keeps every replica on one node. `draft`: the status of
    `spec.runtime.draftModelRef`'s artifact, Ready; `adapters`: the Ready statuses of
    `spec.adapters`' artifacts, by artifact name."""
    info, _, _ = usable(artifact, what="artifact")
    facts = model_facts(info)
    extras = CompanionPlan(
        spec=spec, model=facts, artifact=artifact, draft=draft, adapters=adapters or {}
    )
    facts = replace(facts, loaded_with=extras.companions)
    envelope = runtime_envelope(spec.runtime)
    if envelope.prompt_cache_mib is None:  # kama.serving_defaults: counted, not 8 GiB
        cache = default_prompt_cache_mib(model=facts, envelope=envelope)
        envelope = replace(envelope, prompt_cache_mib=cache)
    location = artifact.serving_location
    assert location is not None and artifact.manifest_digest is not None
    allowed = nodes_that_mount(affinity=location.node_affinity, nodes=nodes)
    one_node = mounted_by_one_node(location.access_modes)
    if one_node and claim_nodes:
        holding = frozenset(claim_nodes)
        allowed = holding if allowed is None else allowed & holding
    placement = Placement(
        mode=spec.placement.mode,
        policy=spec.placement.policy,
        max_gpus_per_replica=spec.placement.max_gpus_per_replica,
        node_selector=spec.placement.node_selector,
        tolerations=tuple(
            (t.key or "", str(t.operator), t.value or "", str(t.effect or ""))
            for t in spec.placement.tolerations
        ),
        allowed_nodes=allowed,
    )
    plan = plan_placement(
        model=facts,
        envelope=envelope,
        placement=placement,
        nodes=[node_from_k8s(n) for n in nodes],
    )
    rejected = _rejected_status(plan)
    if plan.selected is None:
        return DeploymentDecision(plan=plan, template=None, profile=None, rejected=rejected)
    profile = plan.selected
    device = profile.device
    cpu_request = spec.resources.cpu or f"{profile.cpu_millicores}m"
    runtime_plan = replace(
        serving_plan(
            profile=profile,
            entrypoint=entrypoint_of(artifact),
            manifest_digest=artifact.manifest_digest.removeprefix("sha256:"),
        ),
        drain_timeout_s=parse_duration(spec.scaling.drain_timeout).total_seconds(),
        threads=spec.runtime.threads or default_threads(cpu_request=cpu_request),
        load_mode=load_mode(mlock=spec.runtime.expert.mlock, no_mmap=spec.runtime.expert.no_mmap),
        cache_reuse=spec.runtime.expert.cache_reuse,
        mode=None if spec.runtime.mode is ServingMode.GENERATION else str(spec.runtime.mode),
        pooling=None if spec.runtime.pooling is None else str(spec.runtime.pooling),
        **extras.plan_fields(on_gpu=profile.gpus_per_replica),
    )
    template = ServingTemplate(
        image=image,
        plan=runtime_plan,
        claim_name=location.claim_name,
        sub_path=location.sub_path,
        cpu_request=cpu_request,
        memory_request=spec.resources.memory or str(profile.ram_bytes),
        memory_limit=spec.resources.memory_limit,
        gpus=profile.gpus_per_replica,
        gpu_product=profile.gpu_product,
        # left None for nvidia.com/gpu, so those templates keep their fingerprints
        gpu_resource=_unless(device.resource if device else None, GPU_RESOURCE),
        gpu_product_label=_unless(device.product_label if device else None, GPU_PRODUCT_LABEL),
        node_selector=dict(spec.placement.node_selector),
        tolerations=[
            t.model_dump(mode="json", by_alias=True, exclude_none=True)
            for t in spec.placement.tolerations
        ],
        node=profile.node if one_node else None,
        **extras.template_fields(),
    )
    return DeploymentDecision(
        plan=plan, template=template, profile=_profile_status(profile), rejected=rejected
    )


def _unless(value: str | None, default: str) -> str | None:
    return None if value == default else value


def describe_profile(profile: Profile) -> str:
    unit = profile.device.unit if profile.device is not None else "GPU(s)"
    where = (
        f"{profile.gpus_per_replica} {unit}, {profile.n_gpu_layers}/{profile.total_layers} layers"
        if profile.gpus_per_replica
        else "CPU"
    )
    return f"{profile.mode} on {where}: estimated RAM {format_bytes(profile.ram_bytes)}" + (
        f", VRAM {format_bytes(profile.vram_bytes_per_gpu)} per GPU"
        if profile.gpus_per_replica
        else ""
    )


def degraded_condition(*, profile: Profile, asked: PlacementMode) -> ConditionUpdate:
    """`Degraded`: True for a CPU or hybrid fallback from what `placement.mode` asked;
    False when the replica is placed as asked (the whole model on GPU, or CPU because
    CPU was asked)."""
    kind = DeploymentCondition.DEGRADED
    if profile.degraded_reason is not None:
        why = R.CPU_PLACEMENT if profile.mode is ProfileMode.CPU else R.HYBRID_PLACEMENT
        return (kind, True, why, profile.degraded_reason)
    if profile.mode is ProfileMode.GPU:
        return (kind, False, R.FULL_GPU, "the whole model is on GPU")
    return (
        kind,
        False,
        R.AS_REQUESTED,
        f"placed as asked (placement.mode {asked}): {describe_profile(profile)}",
    )
