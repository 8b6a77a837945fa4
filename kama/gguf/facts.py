"""The facts of one GGUF header: what the planner needs to know about a model file,
typed and bounded.

Every number is checked against the bounds of ``kama.api.gguf_bounds`` and every
well-known key against its type, so nothing computed from the facts, such as a list
per layer in the artifact's status, can be made large by a small file; a key of the
wrong type or out of range is ``InvalidGGUF``. A shard set's facts are its first
shard's, with the tensors of all (``kama.gguf.shards``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kama.api.gguf_bounds import (
    MAX_CONTEXT,
    MAX_EXPERTS,
    MAX_FILE_TYPE,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_SPLIT_COUNT,
    MAX_TENSORS,
    MAX_VOCAB,
    MAX_WIDTH,
)
from kama.architectures import LAYOUT_KEYS
from kama.gguf.header import GGUFHeader, InvalidGGUF, SkippedArray

__all__ = [
    "FILE_TYPE_NAMES",
    "GGUFFacts",
    "HeaderSplit",
    "header_facts",
    "split_of",
]

# general.architecture: llama.cpp's names (llama, qwen3moe, jina-bert-v2, ...), and at
# most the 128 characters the status allows.
_ARCH_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

# llama_ftype (general.file_type) -> the usual short name.
FILE_TYPE_NAMES: Mapping[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE",
}  # fmt: skip

KEY_SPLIT_NO = "split.no"
KEY_SPLIT_COUNT = "split.count"
KEY_SPLIT_TENSORS = "split.tensors.count"
MAX_GENERAL_TYPE = 64  # general.type is a short word; no longer is kept in a status


@dataclass(frozen=True)
class GGUFFacts:
    """What the planner needs to know about a model file (or, merged, a shard set).

    Every number lies within ``kama.api.gguf_bounds`` (``MAX_LAYERS`` and friends), so nothing
    derived from it, such as a list per layer, can be made large by a small file.
    """

    architecture: str | None
    name: str | None
    file_type: int | None
    file_type_name: str | None
    parameter_count: int
    n_layer: int | None
    n_ctx_train: int | None
    n_embd: int | None
    n_head: int | None  # the maximum over layers when given per layer
    n_head_kv: int | None  # likewise
    n_head_kv_per_layer: tuple[int, ...] | None  # only when the file gives it per layer
    head_dim_k: int | None
    head_dim_v: int | None
    n_ff: int | None
    n_expert: int | None
    n_expert_used: int | None
    vocab_size: int | None
    split_no: int | None
    split_count: int | None
    split_tensors_count: int | None
    tensor_bytes: int
    tensors: Mapping[str, int]  # tensor name -> data bytes
    layout_keys: Mapping[str, int | tuple[int, ...]] = dataclasses.field(default_factory=dict)
    general_type: str | None = None
    """general.type: "model" (or absent), "adapter" for a LoRA, "mmproj" for a projector."""
    """The ``kama.architectures.LAYOUT_KEYS`` the header has (prefix removed): integers
    (booleans as 0/1) or per-layer arrays of them, at most ``MAX_LAYERS`` long."""


def _int(md: Mapping[str, object], key: str, *, high: int, low: int = 0, why: str) -> int | None:
    """An optional integer fact, type-checked and within ``low..high``."""
    value = md.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidGGUF(f"metadata {key!r} should be an integer, got {_kind(value)}")
    if not low <= value <= high:
        raise InvalidGGUF(f"metadata {key!r} is {value}, outside {low}..{high} ({why})")
    return value


def _kind(value: object) -> str:
    if isinstance(value, SkippedArray):
        return f"an array of {value.length}"
    if isinstance(value, tuple):
        return f"an array of {len(value)}"
    return type(value).__name__


def _str(md: Mapping[str, object], key: str) -> str | None:
    value = md.get(key)
    if value is None or isinstance(value, str):
        return value
    raise InvalidGGUF(f"metadata {key!r} should be a string, got {_kind(value)}")


def _per_layer(
    md: Mapping[str, object], key: str, *, high: int, n_layer: int | None, why: str
) -> tuple[int | None, tuple[int, ...] | None]:
    """An integer that may be given once or per layer: (maximum, per-layer values or None).

    Per-layer values come as one array of exactly ``n_layer`` integers, as llama.cpp
    requires; an array longer than ``MAX_LAYERS`` is never kept, so it fails here too.
    """
    value = md.get(key)
    if not isinstance(value, tuple | SkippedArray):
        return _int(md, key, high=high, why=why), None
    length = value.length if isinstance(value, SkippedArray) else len(value)
    expected = MAX_LAYERS if n_layer is None else n_layer
    if not 0 < length <= expected or (n_layer is not None and length != n_layer):
        wanted = f"{n_layer}" if n_layer is not None else f"1..{MAX_LAYERS}"
        raise InvalidGGUF(f"metadata {key!r} has {length} per-layer values, expected {wanted}")
    if isinstance(value, SkippedArray):  # short, but past the header's budget of kept arrays
        raise InvalidGGUF(
            f"metadata {key!r} comes after too many other arrays to be kept; "
            f"a real header has a few short ones"
        )
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool):
            raise InvalidGGUF(f"metadata {key!r} should be integers, got {type(v).__name__}")
        if not 0 <= v <= high:
            raise InvalidGGUF(f"metadata {key!r} holds {v}, outside 0..{high} ({why})")
    ints = tuple(int(v) for v in value)
    return max(ints), ints


def _layout_keys(md: Mapping[str, object], prefix: str) -> dict[str, int | tuple[int, ...]]:
    """The layout keys present, kept only when they are integers or short integer
    arrays (a key of another type refines nothing and is left out)."""
    kept: dict[str, int | tuple[int, ...]] = {}
    for key in LAYOUT_KEYS:
        value = md.get(prefix + key)
        if isinstance(value, int) and 0 <= value <= MAX_WIDTH:
            kept[key] = int(value)
        elif (
            isinstance(value, tuple)
            and 0 < len(value) <= MAX_LAYERS
            and all(isinstance(v, int) and 0 <= v <= MAX_WIDTH for v in value)
        ):
            kept[key] = tuple(int(v) for v in value)
    return kept


def _architecture(md: Mapping[str, object]) -> str | None:
    arch = _str(md, "general.architecture")
    if arch is not None and not _ARCH_RE.fullmatch(arch):
        raise InvalidGGUF(
            f"metadata 'general.architecture' {arch[:40]!r} is not 1-128 letters, digits, "
            f"'.', '_' or '-'"
        )
    return arch


def header_facts(header: GGUFHeader) -> GGUFFacts:
    """Summarize one header, complete model or not; every fact typed and bounded."""
    md = header.metadata
    arch = _architecture(md)
    p = f"{arch}." if arch else "\0"  # "\0" matches no key when the arch is unknown
    layers = "llama.cpp's LLAMA_MAX_LAYERS is 512"
    n_layer = _int(md, p + "block_count", high=MAX_LAYERS, why=layers)
    heads = "real models have at most 128"
    widths = "real models are under 2**17 wide"
    n_embd = _int(md, p + "embedding_length", high=MAX_WIDTH, why=widths)
    n_head, _ = _per_layer(
        md, p + "attention.head_count", high=MAX_HEADS, n_layer=n_layer, why=heads
    )
    n_head_kv, kv_per_layer = _per_layer(
        md, p + "attention.head_count_kv", high=MAX_HEADS, n_layer=n_layer, why=heads
    )
    n_ff, _ = _per_layer(md, p + "feed_forward_length", high=MAX_WIDTH, n_layer=n_layer, why=widths)
    default_head_dim = n_embd // n_head if n_embd is not None and n_head else None
    head_dim_k = _int(md, p + "attention.key_length", high=MAX_WIDTH, why=widths)
    head_dim_v = _int(md, p + "attention.value_length", high=MAX_WIDTH, why=widths)
    experts = "llama.cpp's LLAMA_MAX_EXPERTS is 512"
    n_expert = _int(md, p + "expert_count", high=MAX_EXPERTS, why=experts)
    n_expert_used = _int(
        md,
        p + "expert_used_count",
        high=MAX_EXPERTS if n_expert is None else n_expert,
        why="at most expert_count",
    )
    vocab = "real vocabularies are under 300k tokens"
    vocab_size = _int(md, p + "vocab_size", high=MAX_VOCAB, why=vocab)
    tokens = md.get("tokenizer.ggml.tokens")
    if vocab_size is None and isinstance(tokens, tuple | SkippedArray):
        vocab_size = tokens.length if isinstance(tokens, SkippedArray) else len(tokens)
    file_type = _int(md, "general.file_type", high=MAX_FILE_TYPE, why="a llama_ftype")
    split = split_of(header)
    return GGUFFacts(
        architecture=arch,
        name=_str(md, "general.name"),
        general_type=(_str(md, "general.type") or "")[:MAX_GENERAL_TYPE] or None,
        file_type=file_type,
        file_type_name=FILE_TYPE_NAMES.get(file_type) if file_type is not None else None,
        parameter_count=sum(t.n_elements for t in header.tensors),
        n_layer=n_layer,
        n_ctx_train=_int(
            md, p + "context_length", high=MAX_CONTEXT, why="the longest real one is 10M"
        ),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv if n_head_kv is not None else n_head,
        n_head_kv_per_layer=kv_per_layer,
        head_dim_k=head_dim_k if head_dim_k is not None else default_head_dim,
        head_dim_v=head_dim_v if head_dim_v is not None else default_head_dim,
        n_ff=n_ff,
        n_expert=n_expert,
        n_expert_used=n_expert_used,
        vocab_size=vocab_size,
        split_no=split.no,
        split_count=split.count,
        split_tensors_count=split.total,
        tensor_bytes=sum(t.n_bytes for t in header.tensors),
        tensors={t.name: t.n_bytes for t in header.tensors},
        layout_keys=_layout_keys(md, p),
    )


@dataclass(frozen=True, slots=True)
class HeaderSplit:
    """What a header says about the split set it belongs to."""

    no: int | None
    count: int | None
    total: int | None
    n_tensors: int
    declared: bool  # whether split.count is present at all


def split_of(header: GGUFHeader) -> HeaderSplit:
    """The split keys of ``header``, typed and bounded (InvalidGGUF otherwise)."""
    md = header.metadata
    names = "llama.cpp's split names have five digits"
    return HeaderSplit(
        no=_int(md, KEY_SPLIT_NO, high=MAX_SPLIT_COUNT - 1, why=names),
        count=_int(md, KEY_SPLIT_COUNT, low=1, high=MAX_SPLIT_COUNT, why=names),
        total=_int(md, KEY_SPLIT_TENSORS, high=MAX_TENSORS, why="the tensor cap of a model"),
        n_tensors=len(header.tensors),
        declared=KEY_SPLIT_COUNT in md,
    )
