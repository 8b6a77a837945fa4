"""Which layers of a model hold what per-sequence memory, by architecture, as the
pinned llama.cpp decides it (``src/models/<arch>.cpp``'s hyper-parameter loading,
``src/llama-hparams.cpp``): a full-context KV cache, a sliding-window KV cache, a
recurrent state, or several of these.

The GGUF header alone does not say it for every model: Gemma 3's file names its
512-token window but not that five of every six layers use it (llama.cpp's code
does), a Qwen3-Next file says which layers are linear attention only through
``full_attention_interval``, and a hybrid such as Jamba marks its Mamba layers by
zero KV heads. So this module keeps llama.cpp's per-architecture rules as data and
reads the keys that refine them. What it does not know it says so
(``MemoryLayout.unmodelled``), and the estimate then takes a documented conservative
rule rather than a silent guess (see ``kama.memory``).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DIFFUSION_ARCHITECTURES",
    "LAYOUT_KEYS",
    "MemoryLayout",
    "memory_layout",
]

LayoutValue = int | tuple[int, ...]

LAYOUT_KEYS: Final = (
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "attention.recurrent_layers",
    "full_attention_interval",
    "attention.kv_lora_rank",
    "rope.dimension_count",
    "attention.indexer.head_count",
    "attention.indexer.key_length",
    "ssm.conv_kernel",
    "ssm.inner_size",
    "ssm.state_size",
    "ssm.group_count",
    "wkv.head_size",
    "shortconv.l_cache",
)
"""Keys (after the ``<architecture>.`` prefix) the layout reads; the GGUF reader keeps
them (integers, booleans as 0/1, or short per-layer arrays of those)."""

F32_BYTES: Final = 4

RECURRENT_ARCHITECTURES: Final = frozenset(
    {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"}
)
"""Every layer recurrent, no KV cache (llama-arch.cpp ``llm_arch_is_recurrent``)."""

ZERO_KV_HEADS_ARE_RECURRENT: Final = frozenset(
    {
        "jamba", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h",
        "nemotron_h_moe", "kimi-linear", "kimi-k3", "bailingmoe3", "glm5-next",
    }
)  # fmt: skip
"""Hybrids whose recurrent layers are the ones with zero KV heads."""

FULL_ATTENTION_INTERVAL: Final[Mapping[str, int | None]] = {
    "qwen3next": 4, "qwen35": 4, "qwen35moe": 4, "qwen4exp": None, "minimax-01": 8,
}  # fmt: skip
"""Hybrids where layer ``i`` is recurrent unless ``(i + 1) % interval == 0`` (the
default interval, None where the file must give it), unless the file lists
``attention.recurrent_layers``."""

EVERY_LAYER_BOTH: Final = frozenset({"falcon-h1"})
"""Hybrids whose every layer has attention and a state-space block side by side."""


@dataclass(frozen=True)
class _Window:
    pattern: int  # set_swa_pattern's n_pattern (0: every layer)
    dense_first: bool = False
    fixed_window: int | None = None  # n_swa set by the code whatever the file says
    needs_window_key: bool = False  # SWA only when the file names a window > 0
    only_with_layers: int | None = None  # SWA only for the model of this depth


SLIDING_WINDOW: Final[Mapping[str, _Window | None]] = {
    "gemma2": _Window(2),
    "gemma3": _Window(6),
    "gemma3n": _Window(5),
    "gemma-embedding": _Window(6),
    "cohere2": _Window(4),
    "cohere2moe": _Window(4, dense_first=True),
    "afmoe": _Window(4),
    "exaone4": _Window(4, only_with_layers=64),  # the 32B model only
    "exaone-moe": _Window(4),
    "llama4": _Window(4, fixed_window=8192),  # chunked attention, 8192-token chunks
    "laguna": _Window(4, dense_first=True, needs_window_key=True),
    "olmo2": _Window(4, needs_window_key=True),
    "plamo3": _Window(8, needs_window_key=True),
    "mellum": _Window(4, needs_window_key=True),
    "smallthinker": _Window(4, dense_first=True, fixed_window=4096, needs_window_key=True),
    "gpt-oss": _Window(2),
    "muse-glimmer": _Window(4),
    "deepseek4": _Window(0),
    "lfm2": _Window(0, needs_window_key=True),  # every attention layer
    # these read the per-layer pattern from the file and have no default
    "granite_swa": None, "maple": None, "mimo2": None, "spark2_5": None, "step35": None,
    "dots3note": None, "gemma4": None,
}  # fmt: skip
"""Architectures with sliding-window layers: llama.cpp's default pattern, used when
the file has no ``attention.sliding_window_pattern`` (None: the file must have it)."""

DECOMPRESSED_LATENT: Final = frozenset({"minicpm3"})
"""Latent-attention architectures whose cache llama.cpp keeps decompressed (heads x
head dims); every other one with ``kv_lora_rank`` keeps the latent and the rope part
as K, with V a view of it."""

DIFFUSION_ARCHITECTURES: Final = frozenset({"dream", "llada", "llada-moe", "rnd1"})
"""Diffusion language models: llama.cpp loads them but llama-server cannot generate
with them (it answers 500), so Kama does not place them."""

MIB: Final = 1 << 20
UNMODELLED_FLOOR_BYTES: Final = 32 * MIB
"""Host bytes an architecture in ``UNMODELLED_MEMORY`` is allowed beyond what is
modelled, unless ``UNMODELLED_FLOOR_OVERRIDES`` says more; set on the planner
benchmark's calibration half (see ``kama.memory.UNMODELLED_SHARE``)."""

UNMODELLED_FLOOR_OVERRIDES: Final[Mapping[str, int]] = {"kimi-k3": 112 * MIB}
"""Measured outliers: kimi-k3's llama-server holds about 90 MiB at start-up that no
buffer llama.cpp reports accounts for (benchmark calibration half)."""

UNMODELLED_MEMORY: Final[Mapping[str, str]] = {
    "deepseek4": "its compressed sparse-attention cache (llama-kv-cache-dsv4)",
    "deepseek32": "its sparse-attention indexer",
    "glm-dsa": "its sparse-attention indexer",
    "dots3note": "its sparse-attention indexer",
    "hy_v4": "its sparse-attention indexer",
    "glm5-next": "its sparse-attention indexer and linear-attention state",
    "minimax-m3": "its sparse-attention indexer",
    "kimi-k3": "its memory-sparse attention",
    "qwen4exp": "its indexer and linear-attention state",
    "hrm_text": "its recurrent reasoning loop's buffers",
    "minimax-01": "its lightning-attention state",
    "kimi-linear": "its delta-attention state",
    "qwen3next": "its gated delta-net state and chunking buffers",
    "qwen35": "its gated delta-net state and chunking buffers",
    "qwen35moe": "its gated delta-net state and chunking buffers",
    "bailingmoe3": "its linear-attention state",
}
"""Architectures whose graphs keep buffers this module does not size; the estimate
adds a conservative allowance and says so."""


@dataclass(frozen=True, kw_only=True)
class MemoryLayout:
    """Per-layer memory kinds of one model, in llama.cpp's terms."""

    sliding_window: int | None = None
    sliding_layers: frozenset[int] = frozenset()
    recurrent_layers: frozenset[int] = frozenset()
    kv_free_layers: frozenset[int] = frozenset()
    kv_widths: tuple[int, int] | None = None
    recurrent_bytes_per_layer: int = 0
    unmodelled: str | None = None
    unmodelled_floor_bytes: int = 0


def _int(keys: Mapping[str, LayoutValue], name: str) -> int:
    value = keys.get(name, 0)
    return value if isinstance(value, int) else 0


def _flags(keys: Mapping[str, LayoutValue], name: str, n_layer: int) -> frozenset[int] | None:
    """A per-layer 0/1 array as the set of layers set; an integer 1 as every layer."""
    value = keys.get(name)
    if isinstance(value, tuple) and len(value) >= n_layer:
        return frozenset(i for i in range(n_layer) if value[i])
    if isinstance(value, int) and value:
        return frozenset(range(n_layer))
    return None


def _pattern(*, n_layer: int, pattern: int, dense_first: bool) -> frozenset[int]:
    """llama_hparams::set_swa_pattern: which layers are sliding."""
    if pattern == 0:
        return frozenset(range(n_layer))
    if dense_first:
        return frozenset(i for i in range(n_layer) if i % pattern != 0)
    return frozenset(i for i in range(n_layer) if i % pattern < pattern - 1)


def _sliding(
    *, architecture: str, keys: Mapping[str, LayoutValue], n_layer: int
) -> tuple[int | None, frozenset[int], str | None]:
    if architecture not in SLIDING_WINDOW:
        return None, frozenset(), None
    rule = SLIDING_WINDOW[architecture]
    if rule is not None and rule.only_with_layers not in (None, n_layer):
        return None, frozenset(), None
    window = _int(keys, "attention.sliding_window")
    if rule is not None and rule.needs_window_key and window <= 0:
        return None, frozenset(), None
    if rule is not None and rule.fixed_window is not None:
        window = rule.fixed_window
    if window <= 0:
        return None, frozenset(), f"{architecture} has sliding-window layers but no window size"
    explicit = keys.get("attention.sliding_window_pattern")
    if isinstance(explicit, tuple) and len(explicit) >= n_layer:
        return window, frozenset(i for i in range(n_layer) if explicit[i]), None
    if isinstance(explicit, int) and explicit > 0:
        dense_first = rule.dense_first if rule is not None else False
        return window, _pattern(n_layer=n_layer, pattern=explicit, dense_first=dense_first), None
    if rule is None:
        return None, frozenset(), f"{architecture}'s file lacks its sliding-window pattern"
    return (
        window,
        _pattern(n_layer=n_layer, pattern=rule.pattern, dense_first=rule.dense_first),
        None,
    )


def _recurrent(
    *,
    architecture: str,
    keys: Mapping[str, LayoutValue],
    n_layer: int,
    kv_heads: Sequence[int] | None,
) -> tuple[frozenset[int], frozenset[int]]:
    """(recurrent layers, layers without a KV cache)."""
    listed = _flags(keys, "attention.recurrent_layers", n_layer)
    if architecture in RECURRENT_ARCHITECTURES:
        every = frozenset(range(n_layer))
        return every, every
    if architecture in EVERY_LAYER_BOTH:
        return frozenset(range(n_layer)), frozenset()
    if architecture in ZERO_KV_HEADS_ARE_RECURRENT:
        if kv_heads is not None:
            zero = frozenset(i for i, h in enumerate(kv_heads) if h == 0)
            return zero, zero
        return (listed or frozenset()), (listed or frozenset())
    if architecture in FULL_ATTENTION_INTERVAL:
        if listed is not None:
            return listed, listed
        interval = _int(keys, "full_attention_interval") or FULL_ATTENTION_INTERVAL[architecture]
        if not interval:
            return frozenset(), frozenset()
        layers = frozenset(i for i in range(n_layer) if (i + 1) % interval != 0)
        return layers, layers
    return frozenset(), frozenset()


def _state_elements(*, keys: Mapping[str, LayoutValue], n_embd: int) -> int:
    """llama_hparams::n_embd_r() + n_embd_s(): one recurrent layer's state per sequence
    (RWKV token shift and WKV state, LFM2 short-convolution cache, or Mamba's
    convolution and SSM states)."""
    head = _int(keys, "wkv.head_size")
    if head:
        return 2 * n_embd + n_embd * head
    l_cache = _int(keys, "shortconv.l_cache")
    if l_cache:
        return n_embd * (l_cache - 1)
    d_conv, d_inner = _int(keys, "ssm.conv_kernel"), _int(keys, "ssm.inner_size")
    d_state, groups = _int(keys, "ssm.state_size"), _int(keys, "ssm.group_count")
    conv = max(d_conv - 1, 0) * (d_inner + 2 * groups * d_state)
    return conv + d_state * d_inner


def memory_layout(
    *,
    architecture: str | None,
    keys: Mapping[str, LayoutValue],
    n_layer: int,
    n_embd: int,
    kv_heads: Sequence[int] | None = None,
) -> MemoryLayout:
    """The layout of a model of ``architecture`` whose header has ``keys`` (the
    ``LAYOUT_KEYS`` it carries, prefix removed) and ``kv_heads`` per layer if given."""
    arch = architecture or ""
    window, sliding, why_not = _sliding(architecture=arch, keys=keys, n_layer=n_layer)
    recurrent, kv_free = _recurrent(
        architecture=arch, keys=keys, n_layer=n_layer, kv_heads=kv_heads
    )
    sliding -= kv_free
    rank = 0 if arch in DECOMPRESSED_LATENT else _int(keys, "attention.kv_lora_rank")
    indexer = (
        _int(keys, "attention.indexer.key_length")
        if _int(keys, "attention.indexer.head_count")
        else 0
    )
    widths = (rank + _int(keys, "rope.dimension_count") + indexer, 0) if rank else None
    state = _state_elements(keys=keys, n_embd=n_embd) * F32_BYTES if recurrent else 0
    unmodelled = UNMODELLED_MEMORY.get(arch) or why_not
    if recurrent and not state:
        unmodelled = unmodelled or f"{arch}'s recurrent state size"
    return MemoryLayout(
        sliding_window=window if sliding else None,
        sliding_layers=sliding,
        recurrent_layers=recurrent,
        kv_free_layers=kv_free,
        kv_widths=widths,
        recurrent_bytes_per_layer=state,
        unmodelled=unmodelled,
        unmodelled_floor_bytes=0
        if unmodelled is None
        else UNMODELLED_FLOOR_OVERRIDES.get(arch, UNMODELLED_FLOOR_BYTES),
    )
