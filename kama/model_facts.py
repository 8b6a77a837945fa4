"""What a model is, as the memory estimate (``kama.memory``) and the planner need it:
its shape (layers, heads, widths, vocabulary, context), its tensors' sizes by name,
which layers keep a KV cache, a sliding window or a recurrent state, and what
llama-server loads next to it (``Companions``: a projector, adapters, a draft model).

Read from an artifact's GGUF facts by ``kama.artifact_facts.model_facts``; this
module only says what the facts are and checks that they hold together.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

__all__ = ["Companions", "ModelFacts", "require_positive"]

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.")
_OUTPUT_PREFIXES = ("output.", "output_norm.")
_TOKEN_EMBD = "token_embd.weight"
_OUTPUT_WEIGHT = "output.weight"


def require_positive(*, owner: str, values: Mapping[str, int | None]) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            raise ValueError(f"{owner}.{name} must be >= 1, got {value}")


@dataclass(frozen=True, kw_only=True)
class Companions:
    """What llama-server loads next to the model, counted with it.

    - ``projector_bytes``: a multimodal projector (``--mmproj``). Its weights go where
      the model's output layer goes (llama-server offloads the projector to the first
      GPU); encoding an image needs a compute buffer that grows with the vision
      tower's patches and heads, which its file does not summarise: the estimate
      counts ``PROJECTOR_COMPUTE_SHARE`` times the weights for it, a stated allowance.
    - ``adapter_bytes``: LoRA adapters (``--lora-scaled``). llama.cpp keeps each
      adapter tensor next to the layer it adapts, so a device holds the share of the
      layers it holds.
    - ``draft``: a draft model for speculative decoding. It has its own KV cache with
      the model's context and precision and is estimated as a model of its own, all on
      the first GPU when the replica has one, else on the host.
    """

    projector_bytes: int = 0
    adapter_bytes: int = 0
    draft: ModelFacts | None = None

    def __post_init__(self) -> None:
        for name in ("projector_bytes", "adapter_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"Companions.{name} must be >= 0: {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class ModelFacts:
    """What the estimator needs from a model. Built from the artifact's ``status.gguf``
    by ``kama.deployment_plan.model_facts``, the one path production, the tests and the
    calibration benchmark share; ``n_head_kv`` is the maximum over layers and
    ``n_head_kv_per_layer``, when the file gives it, the count of each layer."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int
    n_vocab: int
    tensor_bytes: Mapping[str, int]
    n_ff: int | None = None
    n_expert: int | None = None
    n_head_kv_per_layer: tuple[int, ...] | None = None
    file_type: str | None = None
    sliding_window: int | None = None
    """Tokens a sliding-window layer attends to (n_swa), when some layers do."""
    sliding_layers: frozenset[int] = frozenset()
    """Layers whose KV cache is the sliding window's, not the whole context."""
    kv_free_layers: frozenset[int] = frozenset()
    """Layers without a KV cache (recurrent layers of a hybrid, or every layer of a
    recurrent model)."""
    kv_widths: tuple[int, int] | None = None
    """(K, V) elements per cell of every KV layer when not heads x head dims: a
    multi-head latent attention cache keeps the latent and the rope part."""
    recurrent_layers: frozenset[int] = frozenset()
    """Layers with a recurrent state (state-space or linear attention)."""
    recurrent_bytes_per_layer: int = 0
    """One recurrent layer's state per sequence (f32)."""
    unmodelled: str | None = None
    """What of the architecture's memory is not sized here: the estimate then adds an
    allowance (``UNMODELLED_SHARE``) and says so."""
    unmodelled_floor_bytes: int = 0
    loaded_with: Companions = field(default_factory=Companions)
    """What llama-server loads next to the model (a projector, a draft model)."""

    def __post_init__(self) -> None:
        require_positive(
            owner="ModelFacts",
            values={
                "n_layer": self.n_layer,
                "n_embd": self.n_embd,
                "n_head": self.n_head,
                "n_head_kv": self.n_head_kv,
                "head_dim_k": self.head_dim_k,
                "head_dim_v": self.head_dim_v,
                "n_ctx_train": self.n_ctx_train,
                "n_vocab": self.n_vocab,
                "n_ff": self.n_ff,
            },
        )
        if self.sliding_layers and not self.sliding_window:
            raise ValueError("ModelFacts.sliding_layers needs a sliding_window")
        named = self.sliding_layers | self.kv_free_layers | self.recurrent_layers
        outside = sorted(i for i in named if i >= self.n_layer)
        if outside:
            raise ValueError(f"ModelFacts names layers {outside[:4]} of {self.n_layer}")
        if self.n_head_kv_per_layer is not None and len(self.n_head_kv_per_layer) != self.n_layer:
            raise ValueError(
                f"ModelFacts.n_head_kv_per_layer has {len(self.n_head_kv_per_layer)} entries "
                f"for {self.n_layer} layers"
            )
        negative = sorted(name for name, size in self.tensor_bytes.items() if size < 0)
        if negative:
            raise ValueError(f"ModelFacts.tensor_bytes has negative sizes for {negative[:4]}")
        object.__setattr__(self, "tensor_bytes", MappingProxyType(dict(self.tensor_bytes)))

    @property
    def total_weight_bytes(self) -> int:
        return sum(self.tensor_bytes.values())

    @cached_property
    def layer_weight_bytes(self) -> tuple[int, ...]:
        """Bytes of each repeating layer's tensors (``blk.{i}.*``)."""
        sizes = [0] * self.n_layer
        for name, size in self.tensor_bytes.items():
            m = _BLOCK_RE.match(name)
            if m and int(m[1]) < self.n_layer:
                sizes[int(m[1])] += size
        return tuple(sizes)

    @cached_property
    def output_weight_bytes(self) -> int:
        """Bytes of the output layer's own tensors (``output.*``, ``output_norm.*``)."""
        return sum(s for n, s in self.tensor_bytes.items() if n.startswith(_OUTPUT_PREFIXES))

    @property
    def output_gpu_bytes(self) -> int:
        """Bytes the output layer takes on a GPU: with tied embeddings (no
        ``output.weight``) llama.cpp loads a duplicate of ``token_embd.weight`` there."""
        tied = 0 if _OUTPUT_WEIGHT in self.tensor_bytes else self.tensor_bytes.get(_TOKEN_EMBD, 0)
        return self.output_weight_bytes + tied

    @property
    def host_only_weight_bytes(self) -> int:
        """Bytes that never leave the host: ``token_embd`` and any other non-layer tensor."""
        return self.total_weight_bytes - sum(self.layer_weight_bytes) - self.output_weight_bytes

    def kv_heads(self, layer: int) -> int:
        if self.n_head_kv_per_layer is not None:
            return self.n_head_kv_per_layer[layer]
        return self.n_head_kv

    def kv_cell_widths(self, layer: int) -> tuple[int, int]:
        """(K, V) elements one KV cell of ``layer`` holds; (0, 0) without a KV cache."""
        if layer in self.kv_free_layers:
            return 0, 0
        if self.kv_widths is not None:
            return self.kv_widths
        heads = self.kv_heads(layer)
        return self.head_dim_k * heads, self.head_dim_v * heads
