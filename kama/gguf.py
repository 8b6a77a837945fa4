"""Bounded, pure parser for GGUF file headers.

Before Kama schedules a llama-server it must know what a model file is (architecture,
size, native context, attention geometry, how the bytes are split over tensors and
shards) and whether it is a well-formed GGUF at all. Model files come from untrusted
places, so this parser treats every header as hostile: each length and count is capped
(``HeaderLimits``) and checked against the bytes actually left in the file before
anything is allocated, and every defect surfaces as one typed error, ``InvalidGGUF``,
that says what is wrong and at which byte offset (or which metadata key).

The caps sit a few times above the largest real models, so that the worst header they
allow still parses in about a second with tens of MiB: long arrays (token lists, merges)
are walked without being kept, and a shard set is read one header at a time
(``inspect_files``). The facts derived from a header are bounded the same way
(``MAX_LAYERS`` and the other ``MAX_*`` below, each with its source), so that nothing
computed from them, such as a list per layer in the artifact's status, can be made
large by a small file; a file whose facts are out of range is InvalidGGUF, which the
import treats as final instead of retrying.

It reads the header sequentially from the file object's current position (which must be
the start of the file), never seeks and never reads past the header, so it works on a
local file as well as on a stream such as an HTTP range response. No network access, no
dependency on the ``gguf`` package. Byte order: little-endian GGUF v2 and v3 only.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import struct
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kama.architectures import LAYOUT_KEYS

__all__ = [
    "GGML_TYPES",
    "MAX_CONTEXT",
    "MAX_EXPERTS",
    "MAX_FILE_TYPE",
    "MAX_HEADS",
    "MAX_LAYERS",
    "MAX_SPLIT_COUNT",
    "MAX_TENSORS",
    "MAX_VOCAB",
    "MAX_WIDTH",
    "GGUFFacts",
    "GGUFHeader",
    "HeaderLimits",
    "InvalidGGUF",
    "MissingShard",
    "SkippedArray",
    "TensorInfo",
    "check_shard_set",
    "facts_from_header",
    "facts_from_shard_set",
    "inspect_file",
    "inspect_files",
    "parse_shard_name",
    "read_header",
    "shard_file_names",
]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_INT64_MAX = 2**63 - 1
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset
_SKIP_CHUNK = 1 << 16  # bytes read at a time while walking data that is not kept
_MISSING_SHOWN = 8  # missing shards named in a message

# Bounds on the facts, a few times above the largest real models (and no higher than
# what the artifact's status can hold), so a header cannot make anything derived from
# it large: the status keeps one entry per layer.
MAX_LAYERS = 1024  # kama.api's per-layer lists hold 1024; llama.cpp's LLAMA_MAX_LAYERS is 512
MAX_EXPERTS = 1024  # llama.cpp's LLAMA_MAX_EXPERTS is 512 (Qwen3-Next); Kimi K2 has 384
MAX_HEADS = 4096  # attention heads per layer; the most in a real model is 128 (Llama 3.1 405B)
MAX_WIDTH = 1 << 20  # embedding, feed-forward and head widths; the widest real is 73,728 (n_ff)
MAX_CONTEXT = 1 << 24  # native context; the longest real one is 10,485,760 (Llama 4 Scout)
MAX_VOCAB = 1 << 20  # = HeaderLimits.max_array_len; the largest real is 262,144 (Gemma 3)
MAX_SPLIT_COUNT = 99_999  # llama.cpp names shards -00001-of-00003: five digits
MAX_FILE_TYPE = 1024  # general.file_type is a llama_ftype; LLAMA_FTYPE_GUESSED = 1024
MAX_TENSORS = 1 << 16  # per file and per shard set; see HeaderLimits
# general.architecture: llama.cpp's names (llama, qwen3moe, jina-bert-v2, ...), and at
# most the 128 characters the status allows.
_ARCH_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

# ggml type id -> (name, elements per block, bytes per block); mirrors ggml's type traits.
GGML_TYPES: Mapping[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}

# llama_ftype (general.file_type) -> the usual short name.
FILE_TYPE_NAMES: Mapping[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE",
}  # fmt: skip

# GGUF metadata value types.
_T_UINT8, _T_INT8, _T_UINT16, _T_INT16, _T_UINT32, _T_INT32, _T_FLOAT32 = range(7)
_T_BOOL, _T_STRING, _T_ARRAY, _T_UINT64, _T_INT64, _T_FLOAT64 = range(7, 13)
_SCALARS: Mapping[int, tuple[str, int]] = {
    _T_UINT8: ("B", 1),
    _T_INT8: ("b", 1),
    _T_UINT16: ("H", 2),
    _T_INT16: ("h", 2),
    _T_UINT32: ("I", 4),
    _T_INT32: ("i", 4),
    _T_FLOAT32: ("f", 4),
    _T_BOOL: ("?", 1),
    _T_UINT64: ("Q", 8),
    _T_INT64: ("q", 8),
    _T_FLOAT64: ("d", 8),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

KEY_SPLIT_NO = "split.no"
KEY_SPLIT_COUNT = "split.count"
KEY_SPLIT_TENSORS = "split.tensors.count"


class InvalidGGUF(ValueError):
    """The bytes are not a GGUF header this parser accepts; the message says why and where."""


class MissingShard(Exception):
    """A set of split GGUF files is incomplete or inconsistent.

    ``missing`` holds the 1-based shard numbers (as in ``-00002-of-00003.gguf``) that are absent.
    """

    def __init__(self, message: str, *, missing: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


@dataclass(frozen=True)
class HeaderLimits:
    """Caps that keep parsing a hostile header cheap in time and memory.

    Each sits a few times above the largest real model, so that no real file comes near
    it and the worst header it allows parses in about a second with tens of MiB:

    - ``max_array_len``: 2**20 elements. The longest arrays in real files are
      vocabularies (at most 262,144 tokens, Gemma 3) and BPE merge lists (a few 100k).
    - ``max_array_elements_total``: 2**21 for all arrays together; real tokenizers total
      under ~1.1M (tokens, scores, types and merges, or a SentencePiece charsmap).
    - ``max_kept_array_len`` / ``max_kept_elements_total``: arrays of up to 4096
      elements are kept as tuples (per-layer values are at most ``MAX_LAYERS`` long),
      65,536 elements over the whole header; anything else is walked, checked and
      recorded as a ``SkippedArray`` (token lists are never materialised).
    - ``max_kv_count``: 4096 metadata entries; llama.cpp's converters write 30-70.
    - ``max_tensor_count``: 65,536 per file and per shard set. A dense model has
      about 10 tensors per layer (1,300 for 126 layers); merged-expert MoE files stay
      near 2,000; even unmerged experts (35 layers x 128 experts x 3) stay under 14,000.
    - ``max_header_bytes``: 64 MiB; the largest real headers (big vocabularies with
      merges) are about 10-15 MiB.
    """

    max_string_bytes: int = 1 << 20
    max_array_len: int = 1 << 20
    max_array_elements_total: int = 1 << 21
    max_kept_array_len: int = 4096
    max_kept_elements_total: int = 1 << 16
    max_kv_count: int = 4096
    max_tensor_count: int = MAX_TENSORS
    max_n_dims: int = 4  # GGML_MAX_DIMS
    max_tensor_name_bytes: int = 63  # GGML_MAX_NAME - 1
    max_header_bytes: int = 64 << 20


@dataclass(frozen=True, slots=True)
class SkippedArray:
    """An array the parser walked and checked but did not keep (a token list, say):
    only its GGUF element type and its length."""

    element_type: int
    length: int


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor-info record. ``dims`` are in ggml order (ne[0], the row length, first)."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    type_name: str
    offset: int  # absolute file offset of the data
    n_bytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    alignment: int
    metadata: dict[str, object]  # short arrays are tuples, long ones SkippedArray
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    file_size: int


@dataclass(frozen=True)
class GGUFFacts:
    """What the planner needs to know about a model file (or, merged, a shard set).

    Every number lies within the bounds above (``MAX_LAYERS`` and friends), so nothing
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
    """The ``kama.architectures.LAYOUT_KEYS`` the header has (prefix removed): integers
    (booleans as 0/1) or per-layer arrays of them, at most ``MAX_LAYERS`` long."""


class _Cursor:
    """Exact, bounded sequential reads; every failure is an InvalidGGUF naming the offset.

    ``what`` is a fixed description: hot loops pass constant strings and add context
    only when something fails, so the common path formats nothing.
    """

    def __init__(self, *, fileobj: BinaryIO, file_size: int, limits: HeaderLimits) -> None:
        self._f = fileobj
        self._end = file_size
        self._max_header = limits.max_header_bytes
        self.pos = 0

    def remaining(self) -> int:
        return self._end - self.pos

    def _check(self, n: int, what: str) -> None:
        if n > self._end - self.pos:
            raise InvalidGGUF(
                f"{what} at byte {self.pos} needs {n} bytes but the {self._end}-byte file "
                f"has only {self._end - self.pos} left"
            )
        if self.pos + n > self._max_header:
            raise InvalidGGUF(
                f"{what} at byte {self.pos} would take the header past the "
                f"{self._max_header}-byte limit"
            )

    def read(self, n: int, what: str) -> bytes:
        if n > self._end - self.pos or self.pos + n > self._max_header:
            self._check(n, what)
        data = self._f.read(n)
        if len(data) < n:
            data = self._rest(data, n, what)
        self.pos += n
        return data

    def _rest(self, data: bytes, n: int, what: str) -> bytes:
        """Finish a short read (sockets and pipes return what they have)."""
        parts = [data]
        got = len(data)
        while got < n:
            more = self._f.read(n - got)
            if not more:
                raise InvalidGGUF(
                    f"unexpected end of file at byte {self.pos + got} while reading "
                    f"{what} (file_size said {self._end})"
                )
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def skip(self, n: int, what: str) -> None:
        """Consume ``n`` bytes without keeping them (the stream may not seek)."""
        self._check(n, what)
        while n:
            step = min(n, _SKIP_CHUNK)
            self.read(step, what)
            n -= step

    def u32(self, what: str) -> int:
        value: int = _U32.unpack(self.read(4, what))[0]
        return value

    def u64(self, what: str) -> int:
        value: int = _U64.unpack(self.read(8, what))[0]
        return value

    def string(self, what: str, max_bytes: int) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > max_bytes:
            raise InvalidGGUF(
                f"{what} at byte {start} claims {n} bytes, over the {max_bytes} limit"
            )
        raw = self.read(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidGGUF(f"{what} at byte {start} is not UTF-8 ({e.reason})") from None


@dataclass
class _Budget:
    """What is left of the header-wide array caps."""

    elements: int
    kept: int


def _skip_strings(cur: _Cursor, *, count: int, max_bytes: int, what: str) -> None:
    """Walk ``count`` GGUF strings without decoding or keeping them.

    Reads in chunks, but never past the array: every string still to come takes at least
    its 8-byte length, so ``8 * left`` bytes ahead are certainly part of the array.
    """
    buf = b""
    off = 0
    left = count
    unpack_from = _U64.unpack_from
    while left:
        avail = len(buf) - off
        if avail < 8:
            buf = buf[off:] + cur.read(min(_SKIP_CHUNK, 8 * left) - avail, what)
            off = 0
        stop = len(buf) - 8
        while left and off <= stop:  # the hot loop: lengths already in the buffer
            (n,) = unpack_from(buf, off)
            if n > max_bytes:
                at = cur.pos - (len(buf) - off)
                raise InvalidGGUF(
                    f"element {count - left} of {what} at byte {at} claims {n} bytes, "
                    f"over the {max_bytes} limit"
                )
            off += 8 + n
            left -= 1
        if off > len(buf):  # a string runs past the buffer: skip the rest of it
            cur.skip(off - len(buf), what)
            buf = b""
            off = 0


def _read_value(
    cur: _Cursor, *, vtype: int, what: str, limits: HeaderLimits, budget: _Budget
) -> object:
    if vtype in _SCALARS:
        fmt, size = _SCALARS[vtype]
        value: object = struct.unpack("<" + fmt, cur.read(size, what))[0]
        return value
    if vtype == _T_STRING:
        return cur.string(what, limits.max_string_bytes)
    if vtype != _T_ARRAY:
        raise InvalidGGUF(f"{what} at byte {cur.pos - 4} has unknown value type {vtype}")
    start = cur.pos
    etype = cur.u32(f"element type of {what}")
    count = cur.u64(f"length of {what}")
    if etype == _T_STRING:
        min_size = 8
    elif etype in _SCALARS:
        min_size = _SCALARS[etype][1]
    else:
        raise InvalidGGUF(f"{what} at byte {start} is an array of unsupported type {etype}")
    if count > limits.max_array_len:
        raise InvalidGGUF(
            f"{what} at byte {start} claims {count} elements, over the {limits.max_array_len} limit"
        )
    if count * min_size > cur.remaining():
        raise InvalidGGUF(
            f"{what} at byte {start} claims {count} elements, more than the "
            f"{cur.remaining()} bytes left in the file can hold"
        )
    budget.elements -= count
    if budget.elements < 0:
        raise InvalidGGUF(
            f"{what} at byte {start} takes the header past the "
            f"{limits.max_array_elements_total}-element limit for all arrays together"
        )
    keep = count <= limits.max_kept_array_len and count <= budget.kept
    if keep:
        budget.kept -= count
    if etype == _T_STRING:
        if keep:
            max_bytes = limits.max_string_bytes
            return tuple(cur.string(what, max_bytes) for _ in range(count))
        _skip_strings(cur, count=count, max_bytes=limits.max_string_bytes, what=what)
        return SkippedArray(etype, count)
    fmt, size = _SCALARS[etype]
    if keep:
        return struct.unpack(f"<{count}{fmt}", cur.read(count * size, what))
    cur.skip(count * size, what)
    return SkippedArray(etype, count)


@functools.cache
def _dims_type_offset(n_dims: int) -> struct.Struct:
    """The rest of a tensor-info record after ``n_dims``: dims, ggml type, data offset."""
    return struct.Struct(f"<{n_dims}QIQ")


# name, dims, ggml type, offset relative to the data section, data bytes
_RawTensor = tuple[str, tuple[int, ...], int, int, int]


def _read_tensor_infos(cur: _Cursor, *, count: int, limits: HeaderLimits) -> list[_RawTensor]:
    """All tensor-info records; the hot loop of a header with many tensors, so it reads
    each record in three pieces and formats messages only on failure."""
    out: list[_RawTensor] = []
    names: set[str] = set()
    read = cur.read
    max_name, max_dims = limits.max_tensor_name_bytes, limits.max_n_dims
    for index in range(count):
        start = cur.pos
        (n,) = _U64.unpack(read(8, "tensor name length"))
        if n > max_name:
            raise InvalidGGUF(
                f"name of tensor {index} at byte {start} claims {n} bytes, "
                f"over the {max_name} limit"
            )
        try:
            name = read(n, "tensor name").decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidGGUF(
                f"name of tensor {index} at byte {start} is not UTF-8 ({e.reason})"
            ) from None
        (n_dims,) = _U32.unpack(read(4, "tensor n_dims"))
        if n_dims > max_dims:
            raise InvalidGGUF(
                f"tensor {name!r} (info at byte {start}) has {n_dims} dimensions, "
                f"over the {max_dims} limit"
            )
        tail = _dims_type_offset(n_dims)
        *dims, ggml_type, rel_offset = tail.unpack(read(tail.size, "tensor dims, type and offset"))
        kind = GGML_TYPES.get(ggml_type)
        if kind is None:
            raise InvalidGGUF(
                f"tensor {name!r} (info at byte {start}) has unknown ggml type {ggml_type}"
            )
        type_name, block, type_size = kind
        n_elements = 1
        for d in dims:
            n_elements *= d
        if n_elements > _INT64_MAX or max(dims, default=0) > _INT64_MAX:
            raise InvalidGGUF(
                f"tensor {name!r} (info at byte {start}) has dims {dims} whose element "
                f"count overflows int64"
            )
        ne0 = dims[0] if dims else 1
        if ne0 % block:
            raise InvalidGGUF(
                f"tensor {name!r} (info at byte {start}) rows of {ne0} elements are not a "
                f"multiple of the {type_name} block of {block}"
            )
        if name in names:
            raise InvalidGGUF(f"duplicate tensor name {name!r} at byte {start}")
        names.add(name)
        out.append((name, tuple(dims), ggml_type, rel_offset, n_elements // block * type_size))
    return out


def _read_header(cur: _Cursor, *, file_size: int, limits: HeaderLimits) -> GGUFHeader:
    magic = cur.read(4, "magic")
    if magic != GGUF_MAGIC:
        raise InvalidGGUF(f"bad magic {magic!r} at byte 0, expected {GGUF_MAGIC!r}")
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        hint = " (a big-endian file?)" if version & 0xFFFF == 0 else ""
        raise InvalidGGUF(f"unsupported GGUF version {version} at byte 4{hint}; need 2 or 3")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    if n_tensors > limits.max_tensor_count:
        raise InvalidGGUF(
            f"tensor count {n_tensors} at byte 8 is over the {limits.max_tensor_count} limit"
        )
    if n_kv > limits.max_kv_count:
        raise InvalidGGUF(
            f"metadata count {n_kv} at byte 16 is over the {limits.max_kv_count} limit"
        )
    if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > cur.remaining():
        raise InvalidGGUF(
            f"{n_kv} metadata entries and {n_tensors} tensor infos cannot fit in the "
            f"{cur.remaining()} bytes after byte {cur.pos}"
        )

    metadata: dict[str, object] = {}
    alignment = DEFAULT_ALIGNMENT
    budget = _Budget(elements=limits.max_array_elements_total, kept=limits.max_kept_elements_total)
    for i in range(n_kv):
        start = cur.pos
        key = cur.string(f"key of metadata entry {i}", limits.max_string_bytes)
        if key in metadata:
            raise InvalidGGUF(f"duplicate metadata key {key!r} at byte {start}")
        vtype = cur.u32(f"value type of {key!r}")
        metadata[key] = value = _read_value(
            cur, vtype=vtype, what=f"value of {key!r}", limits=limits, budget=budget
        )
        if key == "general.alignment":
            if vtype != _T_UINT32 or not isinstance(value, int):
                raise InvalidGGUF(f"general.alignment at byte {start} must be a uint32")
            if value == 0 or value & (value - 1):
                raise InvalidGGUF(f"general.alignment {value} at byte {start} is not a power of 2")
            alignment = value

    raw = _read_tensor_infos(cur, count=n_tensors, limits=limits)
    data_offset = -(-cur.pos // alignment) * alignment
    tensors: list[TensorInfo] = []
    for name, dims, ggml_type, rel_offset, n_bytes in raw:
        if rel_offset % alignment:
            raise InvalidGGUF(
                f"tensor {name!r} data offset {rel_offset} is not aligned to {alignment}"
            )
        offset = data_offset + rel_offset
        if offset + n_bytes > file_size:
            raise InvalidGGUF(
                f"tensor {name!r} data [{offset}, {offset + n_bytes}) lies beyond "
                f"the end of the {file_size}-byte file"
            )
        tensors.append(TensorInfo(name, dims, ggml_type, GGML_TYPES[ggml_type][0], offset, n_bytes))
    return GGUFHeader(version, alignment, metadata, tuple(tensors), data_offset, file_size)


def read_header(
    fileobj: BinaryIO, *, file_size: int, limits: HeaderLimits = HeaderLimits()
) -> GGUFHeader:
    """Parse and validate the header that starts at ``fileobj``'s current position.

    ``file_size`` is the size of the whole file. Raises InvalidGGUF for any defect; I/O
    errors from ``fileobj`` propagate unchanged. Never reads past the header.
    """
    if file_size < 0:
        raise ValueError(f"file_size must be >= 0, got {file_size}")
    cur = _Cursor(fileobj=fileobj, file_size=file_size, limits=limits)
    try:
        return _read_header(cur, file_size=file_size, limits=limits)
    except InvalidGGUF:
        raise
    except (struct.error, UnicodeDecodeError, OverflowError, MemoryError) as e:
        raise InvalidGGUF(f"malformed header near byte {cur.pos}: {e}") from e


# Facts ----------------------------------------------------------------------------------


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


def _header_facts(header: GGUFHeader) -> GGUFFacts:
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
    split = _split_of(header)
    return GGUFFacts(
        architecture=arch,
        name=_str(md, "general.name"),
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


def facts_from_header(header: GGUFHeader) -> GGUFFacts:
    """Facts of a header that is a whole model.

    Raises MissingShard when the header says it is one shard of a larger split set (a
    lone ``-00001-of-00003.gguf`` is not a model), InvalidGGUF when a well-known key has
    the wrong type or an implausible value.
    """
    check_shard_set([header])
    return _header_facts(header)


# Shard sets ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Split:
    """What a header says about the split set it belongs to."""

    no: int | None
    count: int | None
    total: int | None
    n_tensors: int
    declared: bool  # whether split.count is present at all


def _split_of(header: GGUFHeader) -> _Split:
    md = header.metadata
    names = "llama.cpp's split names have five digits"
    return _Split(
        no=_int(md, KEY_SPLIT_NO, high=MAX_SPLIT_COUNT - 1, why=names),
        count=_int(md, KEY_SPLIT_COUNT, low=1, high=MAX_SPLIT_COUNT, why=names),
        total=_int(md, KEY_SPLIT_TENSORS, high=MAX_TENSORS, why="the tensor cap of a model"),
        n_tensors=len(header.tensors),
        declared=KEY_SPLIT_COUNT in md,
    )


def _check_splits(splits: Sequence[_Split]) -> None:
    if not splits:
        raise MissingShard("no GGUF files given")
    if len(splits) == 1 and not splits[0].declared:
        return
    nos: list[int] = []
    counts: set[int] = set()
    totals: set[int] = set()
    for i, s in enumerate(splits):
        if s.no is None or s.count is None or s.total is None:
            raise MissingShard(f"file {i} of the set lacks the split.no/count/tensors.count keys")
        nos.append(s.no)
        counts.add(s.count)
        totals.add(s.total)
    if len(counts) != 1:
        raise MissingShard(f"shards disagree on split.count: {sorted(counts)}")
    (count,) = counts
    out_of_range = sorted(n + 1 for n in nos if not 0 <= n < count)
    if out_of_range:
        raise MissingShard(f"shard number(s) {out_of_range} are outside 1..{count}")
    duplicates = sorted(n + 1 for n, c in Counter(nos).items() if c > 1)
    if duplicates:
        raise MissingShard(f"shard number(s) {duplicates} of {count} appear more than once")
    present = set(nos)
    missing = tuple(n + 1 for n in range(count) if n not in present)
    if missing:
        shown = missing[:_MISSING_SHOWN]
        more = f" and {len(missing) - len(shown)} more" if len(missing) > len(shown) else ""
        names = ", ".join(f"{n:05d}-of-{count:05d}" for n in shown)
        raise MissingShard(
            f"missing shard(s) {', '.join(map(str, shown))}{more} of {count} ({names}{more})",
            missing=missing,
        )
    if len(totals) != 1:
        raise MissingShard(f"shards disagree on split.tensors.count: {sorted(totals)}")
    (total,) = totals
    found = sum(s.n_tensors for s in splits)
    if found != total:
        raise MissingShard(f"the shards hold {found} tensors but split.tensors.count is {total}")


def check_shard_set(headers: Sequence[GGUFHeader]) -> None:
    """Raise MissingShard unless ``headers`` (any order) form one complete split set.

    A single header without split keys is a complete, unsplit model; a single header
    with ``split.count`` must be shard 1 of 1. Split keys of the wrong type or out of
    range raise InvalidGGUF.
    """
    _check_splits([_split_of(h) for h in headers])


class _Merge:
    """Tensors of a shard set gathered one header at a time, capped over the whole set."""

    def __init__(self, *, max_tensors: int) -> None:
        self.max_tensors = max_tensors
        self.tensors: dict[str, int] = {}
        self.parameter_count = 0

    def add(self, header: GGUFHeader) -> None:
        if len(self.tensors) + len(header.tensors) > self.max_tensors:
            raise InvalidGGUF(
                f"the files hold more than {self.max_tensors} tensors together "
                f"(the limit for one model)"
            )
        for t in header.tensors:
            if t.name in self.tensors:
                raise InvalidGGUF(f"tensor {t.name!r} is in more than one file of the set")
            self.tensors[t.name] = t.n_bytes
            self.parameter_count += t.n_elements

    def facts(self, first: GGUFFacts) -> GGUFFacts:
        return dataclasses.replace(
            first,
            parameter_count=self.parameter_count,
            tensor_bytes=sum(self.tensors.values()),
            tensors=self.tensors,
        )


def facts_from_shard_set(headers: Sequence[GGUFHeader]) -> GGUFFacts:
    """Facts of a complete shard set: metadata of shard 1, tensors of all shards.

    Prefer ``inspect_files``, which does not need every header in memory at once.
    """
    check_shard_set(headers)
    ordered = sorted(headers, key=lambda h: _split_of(h).no or 0)
    merge = _Merge(max_tensors=MAX_TENSORS)
    for h in ordered:
        _header_facts(h)  # every shard's facts are checked, not only the first's
        merge.add(h)
    return merge.facts(_header_facts(ordered[0]))


def inspect_files(paths: Sequence[Path], *, limits: HeaderLimits = HeaderLimits()) -> GGUFFacts:
    """Facts of one model given as its GGUF files: one file, or a complete shard set in
    any order. Reads one header at a time and keeps only its split keys, its tensor sizes
    and (for shard 1) its facts, so a 128-file set costs little more than one header.

    Raises InvalidGGUF or MissingShard (also for a lone shard of a larger set).
    """
    splits: list[_Split] = []
    first: GGUFFacts | None = None
    merge = _Merge(max_tensors=min(limits.max_tensor_count, MAX_TENSORS))
    for path in paths:
        with open(path, "rb") as f:
            header = read_header(f, file_size=os.fstat(f.fileno()).st_size, limits=limits)
        facts = _header_facts(header)
        splits.append(_split_of(header))
        if first is None or facts.split_no == 0:
            first = facts
        merge.add(header)
        del header
    _check_splits(splits)
    assert first is not None  # _check_splits refuses an empty list
    return merge.facts(first)


def shard_file_names(stem: str, count: int) -> list[str]:
    """llama.cpp's split names: ``{stem}-00001-of-0000N.gguf`` ... ``{stem}-0000N-of-0000N.gguf``."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return [f"{stem}-{no:05d}-of-{count:05d}.gguf" for no in range(1, count + 1)]


def parse_shard_name(filename: str) -> tuple[str, int, int] | None:
    """``(stem, no, count)`` (``no`` 1-based) for a split file name, else None."""
    m = _SHARD_RE.match(filename.rsplit("/", 1)[-1])
    if m is None:
        return None
    no, count = int(m["no"]), int(m["count"])
    if not 1 <= no <= count:
        return None
    return m["stem"], no, count


def inspect_file(path: Path) -> GGUFFacts:
    """Read only the header of the GGUF file at ``path`` and summarize it."""
    with open(path, "rb") as f:
        return facts_from_header(read_header(f, file_size=os.fstat(f.fileno()).st_size))
