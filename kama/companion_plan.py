"""What llama-server loads next to a deployment's model, planned from the artifacts'
statuses: the model artifact's multimodal projector, the draft model
(`spec.runtime.draftModelRef`) and the LoRA adapters (`spec.adapters`). Each is
checked before any pod exists (a draft of another vocabulary, an adapter for another
architecture are refused), counted in the memory estimate (`kama.model_facts.Companions`)
and turned into the serving plan's fields and the pod's mounts. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kama.api import ModelArtifactStatus
from kama.api.deployment import ModelDeploymentSpec
from kama.artifact_facts import ArtifactNotUsable, entrypoint_of, model_facts, usable
from kama.cache_layout import BLOBS_DIR
from kama.model_facts import Companions, ModelFacts
from kama.serving_plan import DRAFT_DIR, CompanionArtifact, adapter_mount

ADAPTER_TYPE = "adapter"  # general.type of a LoRA adapter


def projector_bytes(artifact: ModelArtifactStatus) -> int:
    """The size of the artifact's multimodal projector file, 0 without one."""
    if artifact.projector is None:
        return 0
    sizes = [f.size for f in artifact.files if f.path == artifact.projector]
    if not sizes:
        raise ArtifactNotUsable(f"artifact status lists no file {artifact.projector} (projector)")
    return sizes[0]


def draft_companion(*, name: str, artifact: ModelArtifactStatus) -> CompanionArtifact:
    """The draft model's artifact as the serving pod mounts and checks it."""
    _, location, digest = usable(artifact, what=f"draft artifact {name}")
    return CompanionArtifact(
        name=name,
        entrypoint=entrypoint_of(artifact),
        manifest_digest=digest,
        mount=DRAFT_DIR,
        in_place=location.sub_path != f"{BLOBS_DIR}/{digest}",
    )


def draft_facts(*, model: ModelFacts, name: str, artifact: ModelArtifactStatus) -> ModelFacts:
    """The draft's facts; one of another vocabulary is refused (llama-server would
    refuse it at load, after the pod was scheduled)."""
    info, _, _ = usable(artifact, what=f"draft artifact {name}")
    draft = model_facts(info)
    if draft.n_vocab != model.n_vocab:
        raise ArtifactNotUsable(
            f"draft artifact {name} has a vocabulary of {draft.n_vocab} tokens, the model "
            f"{model.n_vocab}: a draft must share the model's vocabulary"
        )
    return draft


def _draft_plan_fields(
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


def _adapter(
    *, name: str, artifact: ModelArtifactStatus | None, architecture: str | None
) -> CompanionArtifact:
    """An adapter's artifact as the pod mounts it; one that is not a LoRA adapter for
    the model's architecture is refused (llama-server would fail to load it)."""
    ref = f"adapter {name}"
    if artifact is None:
        raise ArtifactNotUsable(f"{ref}: its artifact is not Ready")
    info, location, digest = usable(artifact, what=f"{ref}'s artifact")
    if info.type != ADAPTER_TYPE:
        raise ArtifactNotUsable(
            f"{ref}: its artifact's GGUF is general.type {info.type or 'model'}, not "
            f"{ADAPTER_TYPE} (a LoRA adapter converted with convert_lora_to_gguf.py)"
        )
    if info.architecture != architecture:
        raise ArtifactNotUsable(
            f"{ref} is for architecture {info.architecture}, the model is {architecture}"
        )
    entrypoint = entrypoint_of(artifact)
    if any(c in entrypoint for c in ",:"):
        raise ArtifactNotUsable(f"{ref}: its file name {entrypoint!r} has a ',' or ':'")
    return CompanionArtifact(
        name=name,
        entrypoint=entrypoint,
        manifest_digest=digest,
        mount=adapter_mount(name),
        in_place=location.sub_path != f"{BLOBS_DIR}/{digest}",
    )


class CompanionPlan:
    """Everything a deployment loads next to its model, checked: its memory
    (`companions`), its ServingPlan fields and its ServingTemplate fields."""

    def __init__(
        self,
        *,
        spec: ModelDeploymentSpec,
        model: ModelFacts,
        artifact: ModelArtifactStatus,
        draft: ModelArtifactStatus | None,
        adapters: Mapping[str, ModelArtifactStatus],
    ) -> None:
        self.spec, self.artifact, self.draft = spec, artifact, draft
        name = spec.runtime.draft_model_ref
        drafting = None
        if name is not None:
            if draft is None:
                raise ArtifactNotUsable(f"draft artifact {name} is not Ready")
            drafting = draft_facts(model=model, name=name, artifact=draft)
        architecture = artifact.gguf.architecture if artifact.gguf else None
        self.adapters = [
            (
                _adapter(
                    name=a.name, artifact=adapters.get(a.artifact_ref), architecture=architecture
                ),
                adapters[a.artifact_ref],
            )
            for a in spec.adapters
        ]
        self.companions = Companions(
            projector_bytes=projector_bytes(artifact),
            adapter_bytes=sum(status.total_size or 0 for _, status in self.adapters),
            draft=drafting,
        )

    def plan_fields(self, *, on_gpu: int) -> dict[str, Any]:
        """ServingPlan fields: the projector, the draft, the adapters in load order."""
        entries = tuple(
            (a.name, a.entrypoint, a.manifest_digest, a.in_place) for a, _ in self.adapters
        )
        draft = _draft_plan_fields(
            spec=self.spec,
            name=self.spec.runtime.draft_model_ref,
            artifact=self.draft,
            on_gpu=on_gpu,
        )
        return {"projector": self.artifact.projector, "adapters": entries or None, **draft}

    def template_fields(self) -> dict[str, Any]:
        """ServingTemplate fields: where the draft's and the adapters' artifacts are."""
        fields: dict[str, Any] = {}
        if self.draft is not None and self.draft.serving_location is not None:
            fields["draft_claim_name"] = self.draft.serving_location.claim_name
            fields["draft_sub_path"] = self.draft.serving_location.sub_path
        volumes = tuple(
            (a.name, status.serving_location.claim_name, status.serving_location.sub_path)
            for a, status in self.adapters
            if status.serving_location is not None
        )
        return {**fields, "adapter_volumes": volumes or None}
