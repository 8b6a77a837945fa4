"""The GGUF facts an artifact's status reports (``status.gguf``): the model's shape
read from its header(s), its tensor bytes grouped the way llama.cpp offloads them
(``WeightLayout``), and which layers hold which per-sequence memory
(``MemoryLayoutInfo``). The placement planner reads the model from these alone, never
the file (``kama.artifact_facts.model_facts``). Part of the ``modelartifacts.kama.dev``
CRD's schema (``kama.api.artifact``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Final

from pydantic import Field

from kama.api.gguf_bounds import (
    MAX_CONTEXT,
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
)
from kama.api.meta import KamaModel

__all__ = ["MAX_LAYERS", "GGUFInfo", "MemoryLayoutInfo", "WeightLayout"]

# Every count below is bounded by `kama.api.gguf_bounds`, which the import's parser
# applies too: the status is written by the importer, but anyone who may write
# `modelartifacts/status` can forge it, and the planner's work grows with these counts.
_BLOCK_NAME: Final = re.compile(r"^blk\.(\d+)\.")


class WeightLayout(KamaModel):
    """Tensor bytes grouped the way llama.cpp offloads them, for the placement planner
    (which never reads the file): one entry per repeating layer, the output layer, the
    token embeddings (always on the host) and anything else."""

    layers: list[int] = Field(default_factory=list, max_length=MAX_LAYERS)
    """Bytes of each repeating layer's tensors (blk.N.*), in layer order."""
    output: int = Field(default=0, ge=0)
    """Bytes of output.* and output_norm.* tensors."""
    output_tied: bool = False
    """True when there is no output.weight (the embeddings are reused for the output)."""
    token_embedding: int = Field(default=0, ge=0)
    """Bytes of token_embd.weight."""
    other: int = Field(default=0, ge=0)
    """Bytes of every other tensor."""

    @classmethod
    def from_tensors(cls, *, tensors: Mapping[str, int], n_layer: int) -> WeightLayout:
        layers = [0] * n_layer
        output = token_embedding = other = 0
        for name, size in tensors.items():
            block = _BLOCK_NAME.match(name)
            if block and int(block[1]) < n_layer:
                layers[int(block[1])] += size
            elif name.startswith(("output.", "output_norm.")):
                output += size
            elif name == "token_embd.weight":
                token_embedding += size
            else:
                other += size
        return cls(
            layers=layers,
            output=output,
            output_tied="output.weight" not in tensors,
            token_embedding=token_embedding,
            other=other,
        )

    def tensor_bytes(self) -> dict[str, int]:
        """Synthetic per-tensor sizes that group exactly as the real tensors do."""
        sizes = {f"blk.{i}.weights": size for i, size in enumerate(self.layers)}
        sizes["output_norm.weight" if self.output_tied else "output.weight"] = self.output
        sizes["token_embd.weight"] = self.token_embedding
        sizes["other"] = self.other
        return sizes


class MemoryLayoutInfo(KamaModel):
    """Which layers hold which per-sequence memory, as llama.cpp lays the architecture
    out (``kama.architectures``); the planner sizes KV and recurrent state from it."""

    sliding_window: int | None = Field(default=None, ge=1, le=MAX_CONTEXT)
    """Tokens a sliding-window layer keeps (n_swa)."""
    sliding_layers: list[Annotated[int, Field(ge=0, lt=MAX_LAYERS)]] = Field(
        default_factory=list, max_length=MAX_LAYERS
    )
    """Layers whose KV cache holds only the sliding window."""
    recurrent_layers: list[Annotated[int, Field(ge=0, lt=MAX_LAYERS)]] = Field(
        default_factory=list, max_length=MAX_LAYERS
    )
    """Layers with a recurrent (state-space, linear-attention) state."""
    kv_free_layers: list[Annotated[int, Field(ge=0, lt=MAX_LAYERS)]] = Field(
        default_factory=list, max_length=MAX_LAYERS, alias="kvFreeLayers"
    )
    """Layers without a KV cache."""
    kv_cell_widths: list[Annotated[int, Field(ge=0, le=MAX_HEADS * MAX_WIDTH)]] | None = Field(
        default=None, min_length=2, max_length=2, alias="kvCellWidths"
    )
    """(K, V) elements of one KV cell per layer when the cache is not heads x head
    dimensions (multi-head latent attention)."""
    recurrent_bytes_per_layer: int = Field(default=0, ge=0)
    """One recurrent layer's state per sequence."""
    unmodelled: str | None = Field(default=None, max_length=256)
    """What of this architecture's memory the estimator does not size (it then adds a
    conservative allowance)."""
    unmodelled_floor_bytes: int = Field(default=0, ge=0)
    """The host part of that allowance."""


class GGUFInfo(KamaModel):
    """Facts read from the GGUF header(s), merged over a shard set."""

    architecture: str | None = Field(default=None, max_length=128)
    """general.architecture, e.g. llama, qwen2."""
    type: str | None = Field(default=None, max_length=64)
    """general.type: model (or omitted), adapter (a LoRA adapter for `architecture`)."""
    file_type: str | None = Field(default=None, max_length=64)
    """Quantization / file type, e.g. Q4_K_M."""
    parameter_count: int | None = Field(default=None, ge=0)
    """Number of weights."""
    layers: int | None = Field(default=None, ge=0, le=MAX_LAYERS)
    """Transformer blocks (block_count)."""
    context_length: int | None = Field(default=None, ge=0, le=MAX_CONTEXT)
    """Native (training) context length in tokens."""
    embedding_length: int | None = Field(default=None, ge=0, le=MAX_WIDTH)
    """Embedding width."""
    head_count: int | None = Field(default=None, ge=0, le=MAX_HEADS)
    """Attention heads."""
    head_count_kv: int | None = Field(default=None, ge=0, le=MAX_HEADS, alias="headCountKV")
    """Key/value heads (grouped-query attention); the maximum when given per layer."""
    head_count_kv_per_layer: list[Annotated[int, Field(ge=0, le=MAX_HEADS)]] | None = Field(
        default=None, max_length=MAX_LAYERS, alias="headCountKVPerLayer"
    )
    """Key/value heads of each layer, in layer order, when the file gives them per layer
    (the planner sizes each layer's KV cache from them)."""
    head_dim_k: int | None = Field(default=None, ge=0, le=MAX_WIDTH)
    """Key head dimension."""
    head_dim_v: int | None = Field(default=None, ge=0, le=MAX_WIDTH)
    """Value head dimension."""
    expert_count: int | None = Field(default=None, ge=0, le=MAX_EXPERTS)
    """Experts per layer (mixture of experts), if any."""
    expert_used_count: int | None = Field(default=None, ge=0, le=MAX_EXPERTS)
    """Experts used per token, if any."""
    feed_forward_length: int | None = Field(default=None, ge=0, le=MAX_WIDTH)
    """Feed-forward width (the maximum when given per layer)."""
    vocab_size: int | None = Field(default=None, ge=0, le=MAX_VOCAB)
    """Tokens in the vocabulary."""
    weights: WeightLayout | None = None
    """Tensor bytes by layer, for placement."""
    memory_layout: MemoryLayoutInfo | None = None
    """Per-layer memory kinds (sliding window, recurrent, latent KV), for placement."""
