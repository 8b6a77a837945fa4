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
from kama.api import GGUFInfo, ModelArtifactStatus, ServingLocation
from kama.api.deployment import (
    DeploymentCondition,
    MemoryBreakdown,
    ModelDeploymentSpec,
    RejectedCandidate,
    ResolvedProfile,
    Runtime,
)
from kama.api.deployment_choices import POOLED_MODES, PlacementMode, ServingMode
from kama.architectures import DIFFUSION_ARCHITECTURES
from kama.cache_layout import BLOBS_DIR
from kama.conditions import ConditionUpdate
from kama.durations import parse_duration
from kama.gguf.shards import parse_shard_name
from kama.memory import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MICRO_BATCH_SIZE,
    MIB,
    Companions,
    DeviceEstimate,
    ModelFacts,
    RuntimeEnvelope,
    format_bytes,
)
from kama.node_inventory import node_from_k8s
from kama.planner import (
    Placement,
    PlacementPlan,
    Profile,
    ProfileMode,
    plan_placement,
)
from kama.quantities import parse_bytes
from kama.reasons import DeploymentReason as R
from kama.serving_plan import DRAFT_DIR, CompanionArtifact, ServingPlan, load_mode
from kama.serving_pod import ServingTemplate

MAX_REJECTED_IN_STATUS: Final = 64
SINGLE_NODE_ACCESS_MODES: Final = frozenset({"ReadWriteOnce", "ReadWriteOncePod"})


class ArtifactNotUsable(ValueError):
    """The artifact is Ready but lacks what placement needs (facts or location)."""


def model_facts(info: GGUFInfo) -> ModelFacts:
    """What the planner needs from the artifact's ``status.gguf``: the one way to build
    ModelFacts from a model, used alike by the deployment workflow, the tests and the
    calibration benchmark (which go GGUFFacts → ``kama.gguf.artifact_status.gguf_info``
    → here).
    Per-layer KV heads are kept when the file gives them; ArtifactNotUsable names what
    is missing or inconsistent."""
    required = {
        "layers": info.layers,
        "embeddingLength": info.embedding_length,
        "headCount": info.head_count,
        "headCountKV": info.head_count_kv,
        "headDimK": info.head_dim_k,
        "headDimV": info.head_dim_v,
        "contextLength": info.context_length,
        "vocabSize": info.vocab_size,
        "weights": info.weights,
    }
    missing = [name for name, value in required.items() if value is None]
    if missing:
        raise ArtifactNotUsable(f"artifact status.gguf lacks {', '.join(missing)}")
    if info.architecture in DIFFUSION_ARCHITECTURES:
        raise ArtifactNotUsable(
            f"architecture {info.architecture} is a diffusion language model: llama.cpp "
            "loads it, but llama-server cannot generate with it"
        )
    assert info.layers is not None and info.embedding_length is not None
    assert info.head_count is not None and info.head_count_kv is not None
    assert info.head_dim_k is not None and info.head_dim_v is not None
    assert info.context_length is not None and info.vocab_size is not None
    assert info.weights is not None
    per_layer = info.head_count_kv_per_layer
    if per_layer is not None and len(per_layer) != info.layers:
        raise ArtifactNotUsable(
            f"artifact status.gguf headCountKVPerLayer has {len(per_layer)} entries "
            f"for {info.layers} layers"
        )
    layout = info.memory_layout
    layout_facts: dict[str, Any] = {}
    if layout is not None:
        named = [*layout.sliding_layers, *layout.recurrent_layers, *layout.kv_free_layers]
        if any(i >= info.layers for i in named):
            raise ArtifactNotUsable(
                f"artifact status.gguf memoryLayout names a layer beyond its {info.layers}"
            )
        layout_facts = {
            "sliding_window": layout.sliding_window if layout.sliding_layers else None,
            "sliding_layers": frozenset(layout.sliding_layers),
            "kv_free_layers": frozenset(layout.kv_free_layers),
            "recurrent_layers": frozenset(layout.recurrent_layers),
            "recurrent_bytes_per_layer": layout.recurrent_bytes_per_layer,
            "kv_widths": None if layout.kv_cell_widths is None else tuple(layout.kv_cell_widths),
            "unmodelled": layout.unmodelled,
            "unmodelled_floor_bytes": layout.unmodelled_floor_bytes,
        }
    return ModelFacts(
        **layout_facts,
        n_layer=info.layers,
        n_embd=info.embedding_length,
        n_head=info.head_count,
        n_head_kv=info.head_count_kv,
        head_dim_k=info.head_dim_k,
        head_dim_v=info.head_dim_v,
        n_ctx_train=info.context_length,
        n_vocab=info.vocab_size,
        tensor_bytes=info.weights.tensor_bytes(),
        n_ff=info.feed_forward_length,
        n_expert=info.expert_count,
        n_head_kv_per_layer=None if per_layer is None else tuple(per_layer),
        file_type=info.file_type,
    )


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


def entrypoint_of(status: ModelArtifactStatus) -> str:
    """The file llama-server serves: ``status.entrypoint``, or for an artifact published
    before that field existed its only model (one .gguf file or one shard set's first
    shard). Several files without it are not guessed: the one that sorts first may be
    a multimodal projector."""
    if status.entrypoint:
        return status.entrypoint
    ggufs = sorted(f.path for f in status.files if f.path.endswith(".gguf"))
    if not ggufs:
        raise ArtifactNotUsable("artifact status lists no .gguf file")
    shards = [parse_shard_name(p) for p in ggufs]
    if len(ggufs) == 1 or (
        all(shards) and len({(s[0], s[2]) for s in shards if s is not None}) == 1
    ):
        return ggufs[0]
    raise ArtifactNotUsable(
        f"artifact status lists {len(ggufs)} .gguf files ({', '.join(ggufs)}) and no "
        "status.entrypoint (published by an older Kama): recreate the artifact, with "
        "spec.entrypoint naming the model file, so that its status names it"
    )


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


def projector_bytes(artifact: ModelArtifactStatus) -> int:
    """The size of the artifact's multimodal projector file, 0 without one."""
    if artifact.projector is None:
        return 0
    sizes = [f.size for f in artifact.files if f.path == artifact.projector]
    if not sizes:
        raise ArtifactNotUsable(f"artifact status lists no file {artifact.projector} (projector)")
    return sizes[0]


def _usable(artifact: ModelArtifactStatus, *, what: str) -> tuple[GGUFInfo, ServingLocation, str]:
    if artifact.gguf is None or artifact.serving_location is None or not artifact.manifest_digest:
        raise ArtifactNotUsable(f"{what} status lacks gguf facts, servingLocation or digest")
    return (
        artifact.gguf,
        artifact.serving_location,
        artifact.manifest_digest.removeprefix("sha256:"),
    )


def draft_companion(*, name: str, artifact: ModelArtifactStatus) -> CompanionArtifact:
    """The draft model's artifact as the serving pod mounts and checks it."""
    _, location, digest = _usable(artifact, what=f"draft artifact {name}")
    return CompanionArtifact(
        name=name,
        entrypoint=entrypoint_of(artifact),
        manifest_digest=digest,
        mount=DRAFT_DIR,
        in_place=location.sub_path != f"{BLOBS_DIR}/{digest}",
    )


def _draft_facts(*, model: ModelFacts, name: str, artifact: ModelArtifactStatus) -> ModelFacts:
    """The draft's facts; one of another vocabulary is refused (llama-server would
    refuse it at load, after the pod was scheduled)."""
    info, _, _ = _usable(artifact, what=f"draft artifact {name}")
    draft = model_facts(info)
    if draft.n_vocab != model.n_vocab:
        raise ArtifactNotUsable(
            f"draft artifact {name} has a vocabulary of {draft.n_vocab} tokens, the model "
            f"{model.n_vocab}: a draft must share the model's vocabulary"
        )
    return draft


def decide_deployment(
    *,
    spec: ModelDeploymentSpec,
    artifact: ModelArtifactStatus,
    nodes: Sequence[Mapping[str, Any]],
    image: str,
    claim_nodes: Sequence[str] = (),
    draft: ModelArtifactStatus | None = None,
) -> DeploymentDecision:
    """Plan one replica and build its template; FitFailed gives no template.

    `claim_nodes`: where pods already mount the artifact's claim: a claim one node at
    a time can mount keeps every replica on one node. `draft`: the status of
    `spec.runtime.draftModelRef`'s artifact, Ready."""
    info, _, _ = _usable(artifact, what="artifact")
    facts = model_facts(info)
    draft_name = spec.runtime.draft_model_ref
    draft_facts = None
    if draft_name is not None:
        if draft is None:
            raise ArtifactNotUsable(f"draft artifact {draft_name} is not Ready")
        draft_facts = _draft_facts(model=facts, name=draft_name, artifact=draft)
    facts = replace(
        facts,
        loaded_with=Companions(projector_bytes=projector_bytes(artifact), draft=draft_facts),
    )
    envelope = runtime_envelope(spec.runtime)
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
    runtime_plan = replace(
        serving_plan(
            profile=profile,
            entrypoint=entrypoint_of(artifact),
            manifest_digest=artifact.manifest_digest.removeprefix("sha256:"),
        ),
        drain_timeout_s=parse_duration(spec.scaling.drain_timeout).total_seconds(),
        load_mode=load_mode(mlock=spec.runtime.expert.mlock, no_mmap=spec.runtime.expert.no_mmap),
        cache_reuse=spec.runtime.expert.cache_reuse,
        mode=None if spec.runtime.mode is ServingMode.GENERATION else str(spec.runtime.mode),
        pooling=None if spec.runtime.pooling is None else str(spec.runtime.pooling),
        projector=artifact.projector,
        **_draft_plan(spec=spec, name=draft_name, artifact=draft, on_gpu=profile.gpus_per_replica),
    )
    template = ServingTemplate(
        image=image,
        plan=runtime_plan,
        claim_name=location.claim_name,
        sub_path=location.sub_path,
        cpu_request=spec.resources.cpu or f"{profile.cpu_millicores}m",
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
        draft_claim_name=None if draft is None else _usable(draft, what="draft")[1].claim_name,
        draft_sub_path=None if draft is None else _usable(draft, what="draft")[1].sub_path,
    )
    return DeploymentDecision(
        plan=plan, template=template, profile=_profile_status(profile), rejected=rejected
    )


def _draft_plan(
    *,
    spec: ModelDeploymentSpec,
    name: str | None,
    artifact: ModelArtifactStatus | None,
    on_gpu: int,
) -> dict[str, Any]:
    """The ServingPlan fields of the draft model, none without one."""
    if name is None or artifact is None:
        return {}
    companion = draft_companion(name=name, artifact=artifact)
    layers = artifact.gguf.layers if artifact.gguf and artifact.gguf.layers else 0
    return {
        "draft_name": companion.name,
        "draft_entrypoint": companion.entrypoint,
        "draft_manifest_digest": companion.manifest_digest,
        "draft_in_place": companion.in_place,
        "draft_gpu_layers": layers + 1 if on_gpu else 0,
        "draft_max": spec.runtime.draft_max_tokens,
        "draft_min": spec.runtime.draft_min_tokens,
    }


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
