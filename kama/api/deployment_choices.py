"""The closed choices a ModelDeployment's spec offers (placement mode and policy, KV
cache element type, flash attention) and the defaults of its autoscaling.

They are the API's: ``kama.api.deployment`` declares the fields with them, and the
algorithms that act on a choice (``kama.planner``, ``kama.memory``,
``kama.autoscaling``) import them from here, so the API imports no algorithm.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = [
    "DEFAULT_SCALE_DOWN_WINDOW",
    "DEFAULT_SCALE_UP_WINDOW",
    "DEFAULT_TARGET_PERCENT",
    "POOLED_MODES",
    "FlashAttention",
    "KVCacheType",
    "PlacementMode",
    "PlacementPolicy",
    "Pooling",
    "ServingMode",
]

DEFAULT_TARGET_PERCENT: Final = 80
"""``scaling.targetUtilizationPercent``: the share of its slots a replica should have busy."""
DEFAULT_SCALE_UP_WINDOW: Final = "30s"
"""``scaling.scaleUpWindow``: how long demand must ask for more replicas before a scale up."""
DEFAULT_SCALE_DOWN_WINDOW: Final = "5m"
"""``scaling.scaleDownWindow``: how long demand must ask for fewer replicas (and no
scale happen) before a scale down."""


class PlacementMode(StrEnum):
    AUTO = "Auto"
    CPU = "CPU"
    GPU = "GPU"


class PlacementPolicy(StrEnum):
    """How to choose among candidates that fit.

    * Balanced: whole model on the fewest GPUs, best fit (the least VRAM headroom, so the
      roomiest GPUs stay free for bigger models); else hybrid with the most layers on
      GPU; else CPU.
    * Latency: whole model on the fewest GPUs (no hop between GPUs per token), then the
      most VRAM headroom (GFD gives no speed figures; memory size is the proxy for the
      bigger GPU); fallbacks as Balanced.
    * Throughput: whole model spread over up to ``concurrency`` GPUs, as many as fit in
      that range (llama.cpp's layer split pipelines the micro-batches of concurrent
      slots across GPUs, and every GPU gains headroom); then fewest GPUs and most
      headroom. With one slot it chooses like Latency. Fallbacks as Balanced.
    """

    BALANCED = "Balanced"
    THROUGHPUT = "Throughput"
    LATENCY = "Latency"


class KVCacheType(StrEnum):
    """KV cache element types llama-server accepts (``kv_cache_types`` in common/arg.cpp)."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    Q8_0 = "q8_0"
    Q5_1 = "q5_1"
    Q5_0 = "q5_0"
    Q4_1 = "q4_1"
    Q4_0 = "q4_0"
    IQ4_NL = "iq4_nl"


class FlashAttention(StrEnum):
    AUTO = "Auto"
    ON = "On"
    OFF = "Off"


class ServingMode(StrEnum):
    """What a deployment's llama-server serves (``runtime.mode``).

    * Generation: completions and chat (OpenAI, Responses, Anthropic Messages) and
      llama-server's native generation routes.
    * Embedding: ``--embeddings``: ``/v1/embeddings`` (one vector per input, pooled
      as ``runtime.pooling`` or the model says).
    * Rerank: ``--reranking``: ``/v1/rerank`` and ``/rerank`` (a relevance score per
      document; the model needs a ranking head).

    Every mode also serves ``/tokenize`` and ``/detokenize``."""

    GENERATION = "Generation"
    EMBEDDING = "Embedding"
    RERANK = "Rerank"


POOLED_MODES: Final = frozenset({ServingMode.EMBEDDING, ServingMode.RERANK})
"""Modes whose every input token is an output (pooled into one vector or score), so an
input must fit one micro-batch."""


class Pooling(StrEnum):
    """How an embedding deployment pools token embeddings (llama-server ``--pooling``)."""

    MEAN = "Mean"
    CLS = "CLS"
    LAST = "Last"
    NONE = "None"
