"""Memory estimator for one llama-server replica: RAM on the host and VRAM per GPU.

The placement planner (``kama.planner``) must know, before any pod exists, whether a
model with a given runtime envelope (context, slots, KV precision, batch sizes) fits a
node's RAM and GPUs, and how many layers fit when it does not fit whole. This module
answers that from GGUF facts alone, following how the pinned llama.cpp lays a model
out (``src/llama-model.cpp`` ``load_tensors``, ``src/llama-context.cpp``):

* ``--n-gpu-layers k`` offloads the *last* ``k`` of ``n_layer + 1`` units, where unit
  ``n_layer`` is the output layer (``output.weight``, ``output_norm.*``). So the output
  layer is the first unit to move to a GPU and ``k = n_layer + 1`` offloads everything.
  The input layer (``token_embd.weight``) always stays on the host.
* With several GPUs the offloaded units are assigned by the cumulative, normalised
  ``--tensor-split`` proportions (unit ``u`` goes to the first GPU whose split point is
  above ``(u - first) / k``).
* Each layer's KV cache lives with its layer (``offload_kqv`` is on by default).
* Every slot's context is padded to a multiple of 256 cells (``KV_CONTEXT_PADDING``).

Formulas (all bytes; ``E`` = n_embd, ``F`` = n_ff, ``V`` = n_vocab, ``H`` = n_head,
``ub`` = micro batch, ``b`` = batch, ``c`` = padded context per slot, ``s`` = slots)::

    n_ctx_total    = c * s
    KV of layer i  = n_ctx_total * n_head_kv(i) * (head_dim_k * size(k) + head_dim_v * size(v))
    activations    = ub * (COMPUTE_EMBD_FACTOR * E + COMPUTE_FF_FACTOR * F) * 4
    attention      = c * ub * H * 4  (KQ scores of one layer, reused; 0 with flash attention)
                   + c * ub * KQ_MASK_BYTES
    logits         = ub * V * 4
    compute(dev)   = activations            if dev holds any unit
                   + attention              if dev holds a repeating layer
                   + logits                 if dev holds the output layer
                   (+ ub * E * 4 on the host for the input embeddings)
    VRAM(gpu)      = weights on it + KV on it + compute(gpu) + CUDA_CONTEXT_RESERVE_BYTES
    RAM            = weights on the host (mmap'ed pages count) + KV on the host
                   + compute(host) + HOST_OVERHEAD_BYTES + b * V * 4 (output buffer)
                   + the prompt cache's limit (--cache-ram) when the deployment sets one
                   + CUDA_HOST_RUNTIME_BYTES when any GPU is used

``size(t)`` is bytes per element from the ggml block size (q8_0: 34 bytes per 32).
Flash attention ``Auto`` is estimated as off (the larger figure) unless the V cache is
quantized, which makes llama.cpp turn it on. Not modelled (left to calibration against
real llama-server VmHWM, see the benchmarks): the extra compute-buffer copies of
pipeline parallelism across layer-split GPUs, sliding-window KV, MoE routing buffers.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from types import MappingProxyType
from typing import Final

from kama.api.deployment_choices import FlashAttention, KVCacheType
from kama.model_facts import ModelFacts, require_positive

__all__ = [
    "COMPUTE_EMBD_FACTOR",
    "COMPUTE_FF_FACTOR",
    "CUDA_CONTEXT_RESERVE_BYTES",
    "CUDA_HOST_RUNTIME_BYTES",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MICRO_BATCH_SIZE",
    "F32_BYTES",
    "GIB",
    "HOST_OVERHEAD_BYTES",
    "KQ_MASK_BYTES",
    "KV_CONTEXT_PADDING",
    "KV_TYPE_BLOCKS",
    "MIB",
    "DeviceEstimate",
    "MemoryEstimate",
    "RuntimeEnvelope",
    "assign_units",
    "estimate_memory",
    "format_bytes",
    "kv_cache_bytes",
    "padded_context",
]

MIB: Final = 1 << 20
GIB: Final = 1 << 30

F32_BYTES: Final = 4
"""Activations, attention scores and logits are f32 in llama.cpp's graphs."""

KV_CONTEXT_PADDING: Final = 256
"""llama.cpp rounds each slot's context up to a multiple of 256 cells (llama-context.cpp)."""

COMPUTE_EMBD_FACTOR: Final = 4
"""Rows of width n_embd alive at once per token in a layer (residual, norm, Q/K/V, out)."""

COMPUTE_FF_FACTOR: Final = 2
"""Rows of width n_ff alive at once per token in the feed-forward block (gate, up)."""

KQ_MASK_BYTES: Final = 2
"""The attention mask is f16, one element per (KV cell, token of the micro batch)."""

CUDA_CONTEXT_RESERVE_BYTES: Final = 512 * MIB
"""Per GPU: CUDA context, cuBLAS workspace and allocator slack that no tensor accounts for."""

CUDA_HOST_RUNTIME_BYTES: Final = 512 * MIB
"""Host RAM the CUDA driver and libraries take once a process uses a GPU."""

HOST_OVERHEAD_BYTES: Final = 24 * MIB
"""Host RAM of the llama-server process itself (code, threads, HTTP server, allocator
slack), whatever the model. Calibrated by tests/bench/bench_planner.py on its
calibration half (llama-server 11434.0.0 on CPU: the smallest models peak 17.7-18 MiB
above what llama.cpp reports allocating, with compute buffers of about 2 MiB)."""

VOCAB_BYTES_PER_TOKEN: Final = 176
"""Host RAM per vocabulary token: llama_vocab's token data (text, score, attributes),
its token-to-id map and its token-to-piece cache, about 170 bytes a token for
SentencePiece vocabularies. Calibrated on generated models of 32k, 128k and 256k
tokens (the architecture zoo's vocabularies have 128); 262,144 tokens cost 44 MiB."""

UNMODELLED_SHARE: Final = 3
PROJECTOR_COMPUTE_SHARE: Final = 1
"""Image encoding's compute buffer, as a multiple of the projector's weights (an
allowance: llama.cpp sizes it from the vision tower's patches and heads)."""
"""The conservative rule for an architecture whose memory ``kama.architectures`` does
not fully size (``ModelFacts.unmodelled``: sparse-attention indexers, linear-attention
chunk buffers, ...): each device adds ``UNMODELLED_SHARE`` times its modelled compute
buffer, and the host ``ModelFacts.unmodelled_floor_bytes`` more. Set on the planner
benchmark's calibration half so that none of it is estimated low."""

SAMPLER_BYTES_PER_TOKEN: Final = 12
"""Host RAM per vocabulary token per slot: each slot's sampler keeps a candidates array
of ``llama_token_data`` (id, logit, probability: 12 bytes) for the whole vocabulary."""

DEFAULT_BATCH_SIZE: Final = 2048
"""llama.cpp's default ``--batch-size``."""

DEFAULT_MICRO_BATCH_SIZE: Final = 512
"""llama.cpp's default ``--ubatch-size``."""

KV_TYPE_BLOCKS: Final[Mapping[KVCacheType, tuple[int, int]]] = MappingProxyType(
    {
        KVCacheType.F32: (1, 4),
        KVCacheType.F16: (1, 2),
        KVCacheType.BF16: (1, 2),
        KVCacheType.Q8_0: (32, 34),
        KVCacheType.Q5_1: (32, 24),
        KVCacheType.Q5_0: (32, 22),
        KVCacheType.Q4_1: (32, 20),
        KVCacheType.Q4_0: (32, 18),
        KVCacheType.IQ4_NL: (32, 18),
    }
)
"""(elements per block, bytes per block) of each KV type, as in ggml's type traits."""


def _is_quantized(*, kv_type: KVCacheType) -> bool:
    """Whether ``kv_type`` is a block-quantized type (llama.cpp then needs flash attention
    for a V cache of it)."""
    return KV_TYPE_BLOCKS[kv_type][0] > 1


def _row_bytes(*, kv_type: KVCacheType, n_elements: int) -> int:
    """ggml_row_size: bytes of ``n_elements`` values of ``kv_type`` (whole blocks)."""
    per_block, block_bytes = KV_TYPE_BLOCKS[kv_type]
    return -(-n_elements // per_block) * block_bytes


@dataclass(frozen=True, kw_only=True)
class RuntimeEnvelope:
    """The runtime a deployment asked for. The planner never changes any of it.

    ``context_size`` is per request (per slot); None means the model's native context
    with a single slot, so ``concurrency`` must then be 1.
    """

    context_size: int | None = None
    concurrency: int = 1
    kv_key_type: KVCacheType = KVCacheType.F16
    kv_value_type: KVCacheType = KVCacheType.F16
    batch_size: int = DEFAULT_BATCH_SIZE
    micro_batch_size: int = DEFAULT_MICRO_BATCH_SIZE
    flash_attention: FlashAttention = FlashAttention.AUTO
    threads: int | None = None
    prompt_cache_mib: int | None = None  # --cache-ram; None = llama-server's own, uncounted
    pooled: bool = False  # Embedding or Rerank: every token of a batch is an output

    def __post_init__(self) -> None:
        require_positive(
            owner="RuntimeEnvelope",
            values={
                "context_size": self.context_size,
                "concurrency": self.concurrency,
                "batch_size": self.batch_size,
                "micro_batch_size": self.micro_batch_size,
                "threads": self.threads,
            },
        )
        if self.context_size is None and self.concurrency != 1:
            raise ValueError(
                "RuntimeEnvelope.concurrency must be 1 when context_size is omitted "
                f"(the model's native context), got {self.concurrency}"
            )
        if self.micro_batch_size > self.batch_size:
            raise ValueError(
                f"RuntimeEnvelope.micro_batch_size {self.micro_batch_size} is larger than "
                f"batch_size {self.batch_size}"
            )
        if _is_quantized(kv_type=self.kv_value_type) and self.flash_attention is FlashAttention.OFF:
            raise ValueError(
                f"a quantized V cache ({self.kv_value_type}) requires flash attention; "
                "llama.cpp refuses it with flashAttention Off"
            )

    def context_per_slot(self, *, model: ModelFacts) -> int:
        """Context of each slot as requested (the model's native context when omitted)."""
        return self.context_size if self.context_size is not None else model.n_ctx_train

    def ctx_total(self, *, model: ModelFacts) -> int:
        """``--ctx-size``: context per slot times slots."""
        return self.context_per_slot(model=model) * self.concurrency

    @property
    def flash_attention_estimated(self) -> bool:
        """Whether the estimate assumes flash attention. llama-server's `--flash-attn auto`
        turns it on wherever the backend supports it (CPU and CUDA do), which the
        planner benchmark confirmed: no KQ score buffer shows up in the measured RSS."""
        return self.flash_attention is not FlashAttention.OFF


def padded_context(*, model: ModelFacts, envelope: RuntimeEnvelope) -> int:
    """KV cells per slot llama.cpp allocates: the context rounded up to 256."""
    ctx = envelope.context_per_slot(model=model)
    return -(-ctx // KV_CONTEXT_PADDING) * KV_CONTEXT_PADDING


def sliding_window_cells(*, model: ModelFacts, envelope: RuntimeEnvelope) -> int:
    """KV cells per slot of a sliding-window layer (llama-kv-cache-iswa.cpp): the window
    plus one micro batch, at most the slot's context, padded to 256."""
    full = padded_context(model=model, envelope=envelope)
    window = min(full, (model.sliding_window or 0) + envelope.micro_batch_size)
    return -(-window // KV_CONTEXT_PADDING) * KV_CONTEXT_PADDING


def kv_cache_bytes(
    *, model: ModelFacts, envelope: RuntimeEnvelope, layers: Sequence[int] | None = None
) -> int:
    """KV cache bytes of ``layers`` (all when None) for every slot: the padded context
    for a full-attention layer, the window for a sliding one, nothing for a layer
    without a KV cache."""
    full = padded_context(model=model, envelope=envelope)
    window = sliding_window_cells(model=model, envelope=envelope)
    total = 0
    for layer in range(model.n_layer) if layers is None else layers:
        k, v = model.kv_cell_widths(layer)
        if not k and not v:
            continue
        per_cell = _row_bytes(kv_type=envelope.kv_key_type, n_elements=k) + _row_bytes(
            kv_type=envelope.kv_value_type, n_elements=v
        )
        cells = window if layer in model.sliding_layers else full
        total += cells * envelope.concurrency * per_cell
    return total


def recurrent_state_bytes(
    *, model: ModelFacts, envelope: RuntimeEnvelope, layers: Sequence[int] | None = None
) -> int:
    """Recurrent state of ``layers`` (all when None) for every slot."""
    held = model.recurrent_layers if layers is None else model.recurrent_layers & set(layers)
    return len(held) * model.recurrent_bytes_per_layer * envelope.concurrency


def output_bytes(*, model: ModelFacts, envelope: RuntimeEnvelope) -> int:
    """The host's output buffer (``llama_context::output_reserve``): a logits row per
    output, and in a pooled mode (embeddings, reranking) also an embedding row, every
    token of a batch being an output there."""
    if envelope.pooled:
        return envelope.batch_size * (model.n_vocab + model.n_embd) * F32_BYTES
    return output_count(envelope=envelope) * model.n_vocab * F32_BYTES


def output_count(*, envelope: RuntimeEnvelope) -> int:
    """Outputs (logit rows) one batch keeps: llama-server asks for one per slot
    (``server_output_limits``: n_parallel, at most n_batch), not one per token."""
    return min(envelope.batch_size, envelope.concurrency)


def assign_units(
    *, n_layer: int, n_gpu_layers: int, tensor_split: Sequence[int]
) -> tuple[int | None, ...]:
    """Device of each of the ``n_layer + 1`` units (the last is the output layer).

    None is the host, otherwise the GPU index. Mirrors llama.cpp's ``load_tensors``:
    the last ``n_gpu_layers`` units are offloaded, spread by cumulative split points.
    An empty ``tensor_split`` means one GPU.
    """
    units = n_layer + 1
    if not 0 <= n_gpu_layers <= units:
        raise ValueError(f"n_gpu_layers must be in 0..{units}, got {n_gpu_layers}")
    weights = list(tensor_split) or [1]
    if any(w < 0 for w in weights) or sum(weights) == 0:
        raise ValueError(f"tensor_split must be non-negative with a positive sum: {weights}")
    points: list[Fraction] = []
    running = 0
    for w in weights:
        running += w
        points.append(Fraction(running, sum(weights)))
    first = units - n_gpu_layers
    devices: list[int | None] = []
    for unit in range(units):
        if unit < first:
            devices.append(None)
            continue
        where = Fraction(unit - first, n_gpu_layers)
        devices.append(next(i for i, p in enumerate(points) if p > where))
    return tuple(devices)


@dataclass(frozen=True, kw_only=True)
class DeviceEstimate:
    """Estimated bytes on one device (the host or one GPU)."""

    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    overhead_bytes: int
    n_layers: int  # repeating layers held
    holds_output: bool
    recurrent_bytes: int = 0
    output_bytes: int = 0  # the host's logits buffer
    unmodelled_bytes: int = 0  # the conservative allowance (UNMODELLED_SHARE)
    companion_bytes: int = 0  # a projector and a draft model (Companions)

    @property
    def total_bytes(self) -> int:
        return (
            self.companion_bytes
            + self.weights_bytes
            + self.kv_bytes
            + self.recurrent_bytes
            + self.compute_bytes
            + self.output_bytes
            + self.overhead_bytes
            + self.unmodelled_bytes
        )


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """The estimate for one candidate: host RAM plus each GPU's VRAM."""

    n_gpu_layers: int
    host: DeviceEstimate
    gpus: tuple[DeviceEstimate, ...] = field(default=())
    unmodelled: str | None = None  # ModelFacts.unmodelled: why an allowance is in it

    @property
    def ram_bytes(self) -> int:
        return self.host.total_bytes

    @property
    def vram_bytes_by_gpu(self) -> tuple[int, ...]:
        return tuple(g.total_bytes for g in self.gpus)

    @property
    def vram_bytes_per_gpu(self) -> int:
        """The largest GPU's need (every GPU of a replica has the same memory)."""
        return max(self.vram_bytes_by_gpu, default=0)


def _compute_bytes(
    *,
    model: ModelFacts,
    envelope: RuntimeEnvelope,
    n_layers: int,
    holds_output: bool,
    is_host: bool,
) -> int:
    ub = envelope.micro_batch_size
    n_ff = model.n_ff if model.n_ff is not None else 4 * model.n_embd
    ctx = padded_context(model=model, envelope=envelope)
    total = ub * model.n_embd * F32_BYTES if is_host else 0  # input embeddings
    if n_layers or holds_output:
        total += ub * (COMPUTE_EMBD_FACTOR * model.n_embd + COMPUTE_FF_FACTOR * n_ff) * F32_BYTES
    if n_layers:
        scores = 0 if envelope.flash_attention_estimated else ctx * ub * model.n_head * F32_BYTES
        total += scores + ctx * ub * KQ_MASK_BYTES
    if holds_output:
        rows = min(ub, output_count(envelope=envelope))
        total += rows * model.n_vocab * F32_BYTES
    return total


def companion_bytes(
    *, model: ModelFacts, envelope: RuntimeEnvelope, gpus: int, where: int | None, layers: int
) -> int:
    """Bytes of `model`'s companions on one device of a replica with `gpus` GPUs: the
    host (`where` None) or GPU `where`, holding `layers` of the model's layers. The
    projector and the draft go to the first GPU of a GPU replica (the draft keeps on
    the host only what never leaves it), else to the host; adapters follow the layers."""
    extra = model.loaded_with
    total = -(-extra.adapter_bytes * layers // model.n_layer)
    home = 0 if gpus else None  # where the projector and the draft go
    if where == home:
        total += extra.projector_bytes * (1 + PROJECTOR_COMPUTE_SHARE)
    draft = extra.draft
    if draft is None or where not in (home, None):
        return total
    alone = replace(envelope, prompt_cache_mib=None)  # the server's one prompt cache
    estimate = estimate_memory(
        model=draft,
        envelope=alone,
        n_gpu_layers=draft.n_layer + 1 if gpus else 0,
        gpus=min(gpus, 1),
    )
    if where is not None:
        return total + estimate.gpus[0].total_bytes - CUDA_CONTEXT_RESERVE_BYTES
    runtime = CUDA_HOST_RUNTIME_BYTES if gpus else 0  # counted once, by the model
    return total + estimate.host.total_bytes - runtime - HOST_OVERHEAD_BYTES


def estimate_memory(
    *,
    model: ModelFacts,
    envelope: RuntimeEnvelope,
    n_gpu_layers: int,
    gpus: int,
    tensor_split: Sequence[int] = (),
) -> MemoryEstimate:
    """Estimate one replica with ``n_gpu_layers`` units offloaded over ``gpus`` GPUs."""
    if gpus < 0 or (gpus == 0) != (n_gpu_layers == 0):
        raise ValueError(f"n_gpu_layers={n_gpu_layers} does not go with {gpus} GPUs")
    split = tuple(tensor_split) if gpus > 1 else ()
    if gpus > 1 and len(split) != gpus:
        raise ValueError(f"tensor_split {split} does not have one entry per GPU ({gpus})")
    devices = assign_units(n_layer=model.n_layer, n_gpu_layers=n_gpu_layers, tensor_split=split)
    output_device = devices[model.n_layer]

    def device(where: int | None) -> DeviceEstimate:
        is_host = where is None
        layers = [i for i in range(model.n_layer) if devices[i] == where]
        holds_output = output_device == where
        weights = sum(model.layer_weight_bytes[i] for i in layers)
        if holds_output:
            weights += model.output_weight_bytes if is_host else model.output_gpu_bytes
        output = 0
        if is_host:
            weights += model.host_only_weight_bytes
            output = output_bytes(model=model, envelope=envelope)
            overhead = HOST_OVERHEAD_BYTES + model.n_vocab * (
                VOCAB_BYTES_PER_TOKEN + SAMPLER_BYTES_PER_TOKEN * envelope.concurrency
            )
            overhead += (envelope.prompt_cache_mib or 0) * MIB
            overhead += CUDA_HOST_RUNTIME_BYTES if gpus else 0
        else:
            overhead = CUDA_CONTEXT_RESERVE_BYTES
        kv = kv_cache_bytes(model=model, envelope=envelope, layers=layers)
        recurrent = recurrent_state_bytes(model=model, envelope=envelope, layers=layers)
        compute = _compute_bytes(
            model=model,
            envelope=envelope,
            n_layers=len(layers),
            holds_output=holds_output,
            is_host=is_host,
        )
        unmodelled = 0
        if model.unmodelled is not None:
            unmodelled = UNMODELLED_SHARE * compute
            unmodelled += model.unmodelled_floor_bytes if is_host else 0
        companions = companion_bytes(
            model=model, envelope=envelope, gpus=gpus, where=where, layers=len(layers)
        )
        return DeviceEstimate(
            companion_bytes=companions,
            weights_bytes=weights,
            kv_bytes=kv,
            recurrent_bytes=recurrent,
            output_bytes=output,
            compute_bytes=compute,
            unmodelled_bytes=unmodelled,
            overhead_bytes=overhead,
            n_layers=len(layers),
            holds_output=holds_output,
        )

    return MemoryEstimate(
        n_gpu_layers=n_gpu_layers,
        host=device(None),
        gpus=tuple(device(i) for i in range(gpus)),
        unmodelled=model.unmodelled,
    )


def format_bytes(n: int) -> str:
    """``12.3 GiB (13207024435 bytes)``: readable and exact."""
    return f"{n / GIB:.1f} GiB ({n} bytes)"
