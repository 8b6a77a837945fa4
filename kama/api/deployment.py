"""The ModelDeployment resource: serving intent for one ready ModelArtifact.

Users say how a model should be served (context per request, concurrency, KV cache
precision, placement preferences, scaling bounds); Kama decides the hardware shape
and runs the pods. There is deliberately no way to pass raw llama-server arguments,
environment, image, ports, probes or commands: the schema is closed, so such keys
are rejected at any level by `kubectl apply`. `spec.replicas` is served through
the `/scale` subresource for `kubectl scale` and KEDA.

Conditions: `ArtifactReady`, `Placed`, `FitFailed`, `RuntimeReady`, `Serving`,
`Degraded`, `ScaledToZero`, and `Ready`, the one summary that `kubectl wait
--for=condition=Ready` and Helm/Flux/Argo health checks read. The rule, first match
wins:

* `Ready=False` with the reason of the first thing in the way: the artifact is not
  Ready (`ArtifactReady=False`), no placement fits (`Placed=False`, reason
  `FitFailed`), the last rollout failed or was refused (`RuntimeReady=False` with its
  reason, e.g. `RuntimeFailed`, `ProgressDeadlineExceeded`, `Forbidden`), or fewer
  replicas of the current template are ready than desired (`Starting`).
* `Ready=True`, reason `AllReplicasReady`: every desired replica is ready.
* `Ready=True`, reason `ScaledToZero`: zero replicas are desired (by `spec.replicas`
  or the idle timeout) and the model can wake: its artifact is Ready and a placement
  fits, so the first request starts a replica. A model at zero on purpose is healthy,
  not failed.

A CPU or hybrid fallback (`Degraded=True`) is still Ready: it serves, more slowly.
Degraded means less than asked: CPU when `placement.mode` is CPU, or Auto on a
cluster without a GPU, is not a fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from kama.api.cache import QUANTITY_PATTERN
from kama.api.deployment_choices import (
    DEFAULT_SCALE_DOWN_WINDOW,
    DEFAULT_SCALE_UP_WINDOW,
    DEFAULT_TARGET_PERCENT,
    FlashAttention,
    KVCacheType,
    PlacementMode,
    PlacementPolicy,
    Pooling,
    ServingMode,
)
from kama.api.meta import (
    WORKFLOW_ID_FIELD,
    WORKFLOW_ID_MAX,
    CelRule,
    Condition,
    DNSSubdomain,
    KamaModel,
    LocalObjectReference,
    ObjectMeta,
    SpecModel,
    cel,
)
from kama.durations import parse_duration

MODELDEPLOYMENT_KIND: Final = "ModelDeployment"
MODELDEPLOYMENT_PLURAL: Final = "modeldeployments"
MODELDEPLOYMENT_SINGULAR: Final = "modeldeployment"
MODELDEPLOYMENT_SHORT_NAME: Final = "md"

# at most 6 digits a number, so the API server's CEL `duration()` never overflows
DURATION_PATTERN: Final = r"^([0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h))+$"
ALIAS_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,62}$"
LABEL_KEY_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
MAX_CONTEXT: Final = 1 << 22


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(SpecModel):
    """A toleration copied onto serving pods (the Kubernetes shape)."""

    key: str | None = Field(default=None, max_length=317, pattern=LABEL_KEY_PATTERN)
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str | None = Field(default=None, max_length=63)
    effect: TaintEffect | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)


class Placement(SpecModel):
    """Where replicas may run; Kama picks the shape and says why."""

    mode: PlacementMode = PlacementMode.AUTO
    """Auto tries full GPU, then hybrid, then CPU; CPU and GPU force the family."""
    policy: PlacementPolicy = PlacementPolicy.BALANCED
    max_gpus_per_replica: int | None = Field(default=None, ge=1, le=16, alias="maxGPUsPerReplica")
    node_selector: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=32
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)


class KVCache(SpecModel):
    key_type: KVCacheType = KVCacheType.F16
    value_type: KVCacheType = KVCacheType.F16


class ExpertKnobs(SpecModel):
    """A short, typed allow-list of llama-server settings for experts."""

    mlock: bool = False
    """Lock the model in RAM (--mlock)."""
    no_mmap: bool = False
    """Read the model into memory instead of mapping it (--no-mmap)."""
    cache_reuse: int | None = Field(default=None, ge=0, le=4096)
    """Minimum chunk size to reuse from the prompt cache (--cache-reuse)."""


QUANTIZED_V_NEEDS_FLASH_ATTENTION: Final = CelRule(
    rule="!has(self.kvCache) || !self.kvCache.valueType.startsWith('q') && !self.kvCache.valueType.startsWith('iq') || self.flashAttention != 'Off'",
    message="spec.runtime.kvCache.valueType: a quantized V cache needs flashAttention Auto or On",
    field_path=".kvCache.valueType",
)
CONCURRENCY_NEEDS_CONTEXT: Final = CelRule(
    rule="self.concurrency == 1 || has(self.contextSize)",
    message="spec.runtime.contextSize is required when spec.runtime.concurrency is above 1 "
    "(the model's native context is per server, not per request)",
    field_path=".contextSize",
    reason="FieldValueRequired",
)
POOLING_NEEDS_EMBEDDING: Final = CelRule(
    rule="!has(self.pooling) || self.mode == 'Embedding'",
    message="spec.runtime.pooling applies only to spec.runtime.mode Embedding",
    field_path=".pooling",
    reason="FieldValueForbidden",
)
DRAFT_NEEDS_GENERATION: Final = CelRule(
    rule="!has(self.draftModelRef) || self.mode == 'Generation'",
    message="spec.runtime.draftModelRef applies only to spec.runtime.mode Generation",
    field_path=".draftModelRef",
    reason="FieldValueForbidden",
)
DRAFT_TOKENS_NEED_DRAFT: Final = CelRule(
    rule="has(self.draftModelRef) || !has(self.draftMaxTokens) && !has(self.draftMinTokens)",
    message="spec.runtime.draftMaxTokens and draftMinTokens need spec.runtime.draftModelRef",
    field_path=".draftModelRef",
    reason="FieldValueRequired",
)
DRAFT_MIN_NOT_ABOVE_MAX: Final = CelRule(
    rule="!has(self.draftMaxTokens) || !has(self.draftMinTokens) || self.draftMinTokens <= self.draftMaxTokens",
    message="spec.runtime.draftMinTokens must not exceed spec.runtime.draftMaxTokens",
    field_path=".draftMinTokens",
)
UBATCH_NOT_ABOVE_BATCH: Final = CelRule(
    rule="!has(self.batchSize) || !has(self.microBatchSize) || self.microBatchSize <= self.batchSize",
    message="spec.runtime.microBatchSize must not exceed spec.runtime.batchSize",
    field_path=".microBatchSize",
)


class Runtime(SpecModel):
    """How llama-server serves the model. Kama never lowers these to make it fit."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            QUANTIZED_V_NEEDS_FLASH_ATTENTION,
            UBATCH_NOT_ABOVE_BATCH,
            CONCURRENCY_NEEDS_CONTEXT,
            POOLING_NEEDS_EMBEDDING,
            DRAFT_NEEDS_GENERATION,
            DRAFT_TOKENS_NEED_DRAFT,
            DRAFT_MIN_NOT_ABOVE_MAX,
        )
    )

    mode: ServingMode = ServingMode.GENERATION
    """What llama-server serves: Generation (chat, completions, Responses, Messages),
    Embedding (/v1/embeddings) or Rerank (/v1/rerank); the gateway refuses the routes
    of the other modes. In Embedding and Rerank every input must fit one micro-batch:
    batchSize and microBatchSize default to contextSize there."""
    pooling: Pooling | None = None
    """Embedding mode: how token embeddings become one vector; omitted = the model's
    own (its GGUF's pooling type)."""

    context_size: int | None = Field(default=None, ge=128, le=MAX_CONTEXT)
    """Tokens of context per request; omitted = the model's native context (and concurrency 1)."""
    concurrency: int = Field(default=1, ge=1, le=256)
    """Requests served at once (llama-server slots); total KV = contextSize * concurrency."""
    kv_cache: KVCache = Field(default_factory=KVCache)
    batch_size: int | None = Field(default=None, ge=1, le=65536)
    micro_batch_size: int | None = Field(default=None, ge=1, le=65536)
    flash_attention: FlashAttention = FlashAttention.AUTO
    threads: int | None = Field(default=None, ge=1, le=1024)
    """llama-server's threads (--threads); each asks for a CPU. Omitted = one per whole
    CPU the replica requests (resources.cpu, else one CPU), at least one."""
    prompt_cache_memory: str | None = Field(default=None, max_length=32, pattern=QUANTITY_PATTERN)
    """Host memory for llama-server's prompt cache (--cache-ram): conversations that
    left their slot are kept there and restored when they come back. Counted in each
    replica's memory estimate (and so its default memory request); 0 turns the cache
    off; omitted = as much as the slots' KV cache, counted alike."""
    expert: ExpertKnobs = Field(default_factory=ExpertKnobs)
    draft_model_ref: DNSSubdomain | None = None
    """A ModelArtifact in this namespace holding a small model of the same vocabulary:
    llama-server drafts tokens with it and the model accepts or rejects them
    (speculative decoding, --model-draft). Counted in each replica's memory; its KV
    cache has the model's context and precision."""
    draft_max_tokens: int | None = Field(default=None, ge=1, le=64)
    """Tokens drafted per step at most (--spec-draft-n-max); omitted = llama-server's 3."""
    draft_min_tokens: int | None = Field(default=None, ge=0, le=64)
    """Tokens drafted per step at least (--spec-draft-n-min); omitted = llama-server's."""

    @model_validator(mode="after")
    def _context_for_concurrency(self) -> Runtime:
        if self.concurrency > 1 and self.context_size is None:
            raise ValueError(CONCURRENCY_NEEDS_CONTEXT.message)
        if self.pooling is not None and self.mode is not ServingMode.EMBEDDING:
            raise ValueError(POOLING_NEEDS_EMBEDDING.message)
        if self.draft_model_ref is not None and self.mode is not ServingMode.GENERATION:
            raise ValueError(DRAFT_NEEDS_GENERATION.message)
        if self.draft_model_ref is None and (
            self.draft_max_tokens is not None or self.draft_min_tokens is not None
        ):
            raise ValueError(DRAFT_TOKENS_NEED_DRAFT.message)
        if (
            self.draft_max_tokens is not None
            and self.draft_min_tokens is not None
            and self.draft_min_tokens > self.draft_max_tokens
        ):
            raise ValueError(DRAFT_MIN_NOT_ABOVE_MAX.message)
        return self


class Resources(SpecModel):
    """CPU/memory for each replica; GPU resources are Kama's to decide."""

    cpu: str | None = Field(default=None, max_length=32, pattern=QUANTITY_PATTERN)
    memory: str | None = Field(default=None, max_length=32, pattern=QUANTITY_PATTERN)
    memory_limit: str | None = Field(default=None, max_length=32, pattern=QUANTITY_PATTERN)


MIN_NOT_ABOVE_MAX: Final = CelRule(
    rule="self.minReplicas <= self.maxReplicas",
    message="spec.scaling.minReplicas must not exceed spec.scaling.maxReplicas",
    field_path=".minReplicas",
)


def _duration_message(*, field: str, longest: str) -> str:
    return f"spec.scaling.{field} must be a duration above 0 and at most {longest}"


def _duration_check(*, field: str, longest: str) -> Callable[[str], str]:
    """The Python side of the CEL rule below, with the same message."""
    limit = parse_duration(longest)

    def check(value: str) -> str:
        if not timedelta(0) < parse_duration(value) <= limit:
            raise ValueError(_duration_message(field=field, longest=longest))
        return value

    return check


def _duration_field(*, field: str, longest: str) -> Any:
    rule = CelRule(
        rule=f"duration(self) > duration('0s') && duration(self) <= duration('{longest}')",
        message=_duration_message(field=field, longest=longest),
    )
    return Field(max_length=32, pattern=DURATION_PATTERN, json_schema_extra=cel(rule))


# an idle model may be kept up for a month; a request is not held (cold start) past an
# hour — no HTTP client waits longer; a drain beyond a day is a stuck stream
IdleTimeout = Annotated[
    str,
    _duration_field(field="idleTimeout", longest="720h"),
    AfterValidator(_duration_check(field="idleTimeout", longest="720h")),
]
ColdStartTimeout = Annotated[
    str,
    _duration_field(field="coldStartTimeout", longest="1h"),
    AfterValidator(_duration_check(field="coldStartTimeout", longest="1h")),
]
DrainTimeout = Annotated[
    str,
    _duration_field(field="drainTimeout", longest="24h"),
    AfterValidator(_duration_check(field="drainTimeout", longest="24h")),
]
# autoscaling windows: up within an hour, down within a day
ScaleUpWindow = Annotated[
    str,
    _duration_field(field="scaleUpWindow", longest="1h"),
    AfterValidator(_duration_check(field="scaleUpWindow", longest="1h")),
]
ScaleDownWindow = Annotated[
    str,
    _duration_field(field="scaleDownWindow", longest="24h"),
    AfterValidator(_duration_check(field="scaleDownWindow", longest="24h")),
]


class Autoscaler(StrEnum):
    KAMA = "Kama"
    KEDA = "KEDA"


class Scaling(SpecModel):
    model_config = ConfigDict(json_schema_extra=cel(MIN_NOT_ABOVE_MAX))

    min_replicas: int = Field(default=0, ge=0, le=1000)
    max_replicas: int = Field(default=1, ge=1, le=1000)
    idle_timeout: IdleTimeout = "10m"
    cold_start_timeout: ColdStartTimeout = "10m"
    max_queued_requests: int = Field(default=100, ge=0, le=100000)
    drain_timeout: DrainTimeout = "2m"
    target_utilization_percent: int = Field(default=DEFAULT_TARGET_PERCENT, ge=1, le=100)
    """Share of a replica's slots (`runtime.concurrency`) that demand may keep busy
    before Kama adds a replica (requests in flight plus queued, over all gateways)."""
    scale_up_window: ScaleUpWindow = DEFAULT_SCALE_UP_WINDOW
    """Demand must want more replicas for this long before Kama scales up."""
    scale_down_window: ScaleDownWindow = DEFAULT_SCALE_DOWN_WINDOW
    """Demand must want fewer replicas, and no scale have happened, for this long
    before Kama removes one replica."""
    autoscaler: Autoscaler = Autoscaler.KAMA
    """Who sets `spec.replicas` from demand. `Kama`: the rule above, built in. `KEDA`:
    Kama writes a KEDA ScaledObject for this deployment (bounds, windows as the HPA's
    stabilisation windows, idleTimeout as the cooldown, and the gateway's demand
    through KEDA's external-scaler contract) and stands back from replica decisions
    (wake, scale up and down, idle) while that ScaledObject exists; where KEDA is not
    installed, Kama says so in an Event and keeps scaling itself."""


class RoutingStrategy(StrEnum):
    LEAST_LOAD = "LeastLoad"
    PREFIX_AFFINITY = "PrefixAffinity"


class Routing(SpecModel):
    strategy: RoutingStrategy = RoutingStrategy.LEAST_LOAD
    """`LeastLoad`: the replica with the least slot pressure. `PrefixAffinity`: requests
    that start alike (the same first messages or prompt start) go to the same replica,
    whose llama-server keeps that prefix in a slot's prompt cache, unless that replica
    is already busier than 1.25x the average (consistent hashing with bounded loads)."""
    allow_remote_media_urls: bool = False
    """Pass on requests whose images name a URL (Chat's `image_url`, Responses'
    `input_image`, Messages' `source.type: url`), which llama-server then fetches from
    the serving pod. Off (the default), the gateway answers them 400 and only `data:`
    URLs pass, so a client cannot make a serving pod reach addresses of its choosing."""


ADAPTER_NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class Adapter(SpecModel):
    """A LoRA adapter llama-server loads next to the model, applied only to the
    requests that name it: model `<namespace>/<deployment>:<name>` (or `<alias>:<name>`)."""

    name: str = Field(min_length=1, max_length=63, pattern=ADAPTER_NAME_PATTERN)
    """What a request appends to the model's name to select the adapter."""
    artifact_ref: DNSSubdomain
    """The ModelArtifact (same namespace) holding the adapter's GGUF file (general.type
    adapter), made for the model's architecture."""
    scale: float = Field(default=1.0, gt=0, le=16)
    """How strongly a selected adapter applies (llama-server's per-request `lora` scale);
    an adapter not selected applies with scale 0."""


class ModelDeploymentSpec(SpecModel):
    model_ref: LocalObjectReference
    """The ModelArtifact (same namespace) to serve."""
    adapters: list[Adapter] = Field(
        default_factory=list,
        max_length=8,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """LoRA adapters loaded with the model (--lora-scaled, scale 0) and selected per
    request; each counted in the replica's memory."""
    aliases: list[Annotated[str, Field(max_length=63, pattern=ALIAS_PATTERN)]] = Field(
        default_factory=list, max_length=16
    )
    """Extra names the gateway accepts for this model."""
    replicas: int = Field(default=0, ge=0, le=1000)
    """Desired replicas now; written by `kubectl scale`, KEDA and Kama's wake/idle logic."""
    placement: Placement = Field(default_factory=Placement)
    runtime: Runtime = Field(default_factory=Runtime)
    resources: Resources = Field(default_factory=Resources)
    scaling: Scaling = Field(default_factory=Scaling)
    routing: Routing = Field(default_factory=Routing)


class RejectedCandidate(KamaModel):
    candidate: str = Field(max_length=256)
    node: str | None = Field(default=None, max_length=253)
    reason: str = Field(max_length=1024)
    required_bytes: int | None = Field(default=None, ge=0)
    available_bytes: int | None = Field(default=None, ge=0)


class MemoryBreakdown(KamaModel):
    """One device's estimate by component (bytes), so a reservation can be checked
    against what llama-server reports allocating."""

    weights_bytes: int = Field(default=0, ge=0)
    kv_bytes: int = Field(default=0, ge=0)
    """KV cache: full-context layers, sliding-window layers at their window."""
    recurrent_bytes: int = Field(default=0, ge=0)
    """Recurrent (state-space, linear-attention) state of every slot."""
    compute_bytes: int = Field(default=0, ge=0)
    output_bytes: int = Field(default=0, ge=0)
    """The logits buffer: one row per slot."""
    overhead_bytes: int = Field(default=0, ge=0)
    """The process, vocabulary and samplers on the host; the CUDA context on a GPU."""
    unmodelled_bytes: int = Field(default=0, ge=0)
    """The conservative allowance for buffers the estimator does not size."""


class ResolvedProfile(KamaModel):
    mode: Literal["CPU", "GPU", "Hybrid"]
    node: str | None = Field(default=None, max_length=253)
    gpus_per_replica: int = Field(default=0, ge=0)
    gpu_resource: str | None = Field(default=None, max_length=253)
    """The extended resource each replica requests gpusPerReplica of (nvidia.com/gpu,
    nvidia.com/mig-1g.10gb)."""
    gpu_sharing: str | None = Field(default=None, max_length=64)
    """How that device is shared: time-slicing or mps (each replica counts the card's
    memory divided by its replicas) or MIG; absent for whole cards."""
    gpu_layers: int = Field(default=0, ge=0)
    split_mode: str | None = Field(default=None, max_length=16)
    tensor_split: list[float] = Field(default_factory=list, max_length=16)
    estimated_ram_bytes: int = Field(default=0, ge=0)
    estimated_vram_bytes_per_gpu: int = Field(default=0, ge=0)
    available_ram_bytes: int | None = Field(default=None, ge=0)
    available_vram_bytes_per_gpu: int | None = Field(default=None, ge=0)
    decision: Literal["Estimated", "Profiled"] = "Estimated"
    host_memory: MemoryBreakdown | None = None
    """The RAM estimate by component."""
    gpu_memory: MemoryBreakdown | None = None
    """The most loaded GPU's estimate by component."""
    unmodelled: str | None = Field(default=None, max_length=256)
    """What of the architecture's memory is an allowance rather than sized."""


class ModelDeploymentStatus(KamaModel):
    observed_generation: int | None = Field(default=None, ge=0)
    workflow_id: str | None = Field(
        default=None, alias=WORKFLOW_ID_FIELD, max_length=WORKFLOW_ID_MAX
    )
    """The Temporal workflow that keeps this resource (open it in the Temporal UI, or
    `temporal workflow describe -w <id>`)."""
    replicas: int = Field(default=0, ge=0)
    ready_replicas: int = Field(default=0, ge=0)
    desired_replicas: int | None = Field(default=None, ge=0)
    """The replicas Kama converges to now: spec.replicas within minReplicas and
    maxReplicas (the DESIRED column)."""
    selector: str | None = Field(default=None, max_length=1024)
    """Label selector of the serving pods (for the /scale subresource)."""
    profile: ResolvedProfile | None = None
    rejected_candidates: list[RejectedCandidate] = Field(default_factory=list, max_length=64)
    artifact_digest: str | None = Field(default=None, max_length=71)
    runtime_image: str | None = Field(default=None, max_length=512)
    fingerprint: str | None = Field(default=None, max_length=64)
    ready: str | None = Field(default=None, max_length=32)
    """Ready replicas / desired replicas, e.g. 1/2 (the READY column)."""
    reason: str | None = Field(default=None, max_length=64)
    """One word on what the deployment is doing or waiting for (the REASON column)."""
    endpoints: int = Field(default=0, ge=0)
    last_wake: datetime | None = None
    conditions: list[Condition] = Field(default_factory=list, max_length=16)


class DeploymentCondition(StrEnum):
    ARTIFACT_READY = "ArtifactReady"
    PLACED = "Placed"
    FIT_FAILED = "FitFailed"
    RUNTIME_READY = "RuntimeReady"
    SERVING = "Serving"
    DEGRADED = "Degraded"
    SCALED_TO_ZERO = "ScaledToZero"
    READY = "Ready"
    """The summary for `kubectl wait` and health checks (the rule is in the module
    docstring)."""


class ModelDeployment(KamaModel):
    """Serving intent for one ready ModelArtifact."""

    api_version: Literal["kama.dev/v1alpha1"] = "kama.dev/v1alpha1"
    kind: Literal["ModelDeployment"] = "ModelDeployment"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ModelDeploymentSpec
    status: ModelDeploymentStatus | None = None


__all__ = [
    "MODELDEPLOYMENT_KIND",
    "MODELDEPLOYMENT_PLURAL",
    "MODELDEPLOYMENT_SHORT_NAME",
    "MODELDEPLOYMENT_SINGULAR",
    "Autoscaler",
    "DeploymentCondition",
    "ModelDeployment",
    "ModelDeploymentSpec",
    "ModelDeploymentStatus",
]


def artifacts_named(spec: Mapping[str, Any]) -> frozenset[str]:
    """The ModelArtifacts a ModelDeployment's raw `spec` names: its model, its draft
    model and its adapters (for the watcher, which reads specs as the API server sends them)."""
    model = (spec.get("modelRef") or {}).get("name")
    draft = (spec.get("runtime") or {}).get("draftModelRef")
    adapters = [a.get("artifactRef") for a in spec.get("adapters") or [] if isinstance(a, dict)]
    return frozenset(n for n in (model, draft, *adapters) if isinstance(n, str))
