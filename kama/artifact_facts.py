"""What an imported ModelArtifact's status gives a deployment: the model's facts for
the memory estimate, the file llama-server serves, and the error when a Ready artifact
lacks them. Shared by the deployment plan and the plan of what is loaded next to the
model (`kama.companion_plan`). Pure: no I/O."""

from __future__ import annotations

from typing import Any

from kama.api import GGUFInfo, ModelArtifactStatus, ServingLocation
from kama.architectures import DIFFUSION_ARCHITECTURES
from kama.gguf.shards import parse_shard_name
from kama.model_facts import ModelFacts

__all__ = ["ArtifactNotUsable", "entrypoint_of", "model_facts", "usable"]


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


def usable(artifact: ModelArtifactStatus, *, what: str) -> tuple[GGUFInfo, ServingLocation, str]:
    if artifact.gguf is None or artifact.serving_location is None or not artifact.manifest_digest:
        raise ArtifactNotUsable(f"{what} status lacks gguf facts, servingLocation or digest")
    return (
        artifact.gguf,
        artifact.serving_location,
        artifact.manifest_digest.removeprefix("sha256:"),
    )
