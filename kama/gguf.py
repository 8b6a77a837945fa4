"""Bounded, pure parser for GGUF file headers.

Before Kama schedules a llama-server it must know what a model file is (architecture,
size, native context, attention geometry, how the bytes are split over tensors and
shards) and whether it is a well-formed GGUF at all. Model files come from untrusted
places, so this parser treats every header as hostile: each length and count is capped
(``HeaderLimits``) and checked against the bytes actually left in the file before
anything is allocated, and every defect surfaces as one typed error, ``InvalidGGUF``,
that says what is wrong and at which byte offset.

It reads the header sequentially from the file object's current position (which must be
the start of the file), never seeks and never reads tensor data, so it works on a local
file as well as on a stream such as an HTTP range response. No network access, no
dependency on the ``gguf`` package. Byte order: little-endian GGUF v2 and v3 only.
"""

from __future__ import annotations

import dataclasses
import os
import re
import struct
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "GGML_TYPES",
    "GGUFFacts",
    "GGUFHeader",
    "HeaderLimits",
    "InvalidGGUF",
    "MissingShard",
    "TensorInfo",
    "check_shard_set",
    "facts_from_header",
    "facts_from_shard_set",
    "inspect_file",
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
    """Caps that keep parsing a hostile header cheap in time and memory."""

    max_string_bytes: int = 1 << 20
    max_array_len: int = 4 << 20
    max_array_elements_total: int = 8 << 20
    max_kv_count: int = 1 << 20
    max_tensor_count: int = 1 << 20
    max_n_dims: int = 4  # GGML_MAX_DIMS
    max_tensor_name_bytes: int = 63  # GGML_MAX_NAME - 1
    max_header_bytes: int = 64 << 20


@dataclass(frozen=True)
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
    metadata: dict[str, object]  # arrays are tuples
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    file_size: int


@dataclass(frozen=True)
class GGUFFacts:
    """What the planner needs to know about a model file (or, merged, a shard set)."""

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


class _Cursor:
    """Exact, bounded sequential reads; every failure is an InvalidGGUF naming the offset."""

    def __init__(self, fileobj: BinaryIO, file_size: int, limits: HeaderLimits) -> None:
        self._f = fileobj
        self._end = file_size
        self._max_header = limits.max_header_bytes
        self.pos = 0

    def remaining(self) -> int:
        return self._end - self.pos

    def read(self, n: int, what: str) -> bytes:
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
        data = self._f.read(n)
        while len(data) < n:
            more = self._f.read(n - len(data))
            if not more:
                raise InvalidGGUF(
                    f"unexpected end of file at byte {self.pos + len(data)} while reading "
                    f"{what} (file_size said {self._end})"
                )
            data += more
        self.pos += n
        return data

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


def _read_value(
    cur: _Cursor, vtype: int, what: str, limits: HeaderLimits, budget: list[int]
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
    budget[0] -= count
    if budget[0] < 0:
        raise InvalidGGUF(
            f"{what} at byte {start} takes the header past the "
            f"{limits.max_array_elements_total}-element limit for all arrays together"
        )
    if etype == _T_STRING:
        max_bytes = limits.max_string_bytes
        return tuple(cur.string(what, max_bytes) for _ in range(count))
    fmt, size = _SCALARS[etype]
    return struct.unpack(f"<{count}{fmt}", cur.read(count * size, what))


def _read_tensor_info(cur: _Cursor, index: int, limits: HeaderLimits) -> tuple[int, TensorInfo]:
    start = cur.pos
    name = cur.string(f"name of tensor {index}", limits.max_tensor_name_bytes)
    where = f"tensor {name!r} (info at byte {start})"
    n_dims = cur.u32(f"n_dims of {where}")
    if n_dims > limits.max_n_dims:
        raise InvalidGGUF(f"{where} has {n_dims} dimensions, over the {limits.max_n_dims} limit")
    dims = struct.unpack(f"<{n_dims}Q", cur.read(8 * n_dims, f"dims of {where}"))
    ggml_type = cur.u32(f"type of {where}")
    rel_offset = cur.u64(f"data offset of {where}")
    if ggml_type not in GGML_TYPES:
        raise InvalidGGUF(f"{where} has unknown ggml type {ggml_type}")
    type_name, block, type_size = GGML_TYPES[ggml_type]
    n_elements = 1
    for d in dims:
        n_elements *= d
        if d > _INT64_MAX or n_elements > _INT64_MAX:
            raise InvalidGGUF(f"{where} has dims {list(dims)} whose element count overflows int64")
    ne0 = dims[0] if dims else 1
    if ne0 % block:
        raise InvalidGGUF(
            f"{where} rows of {ne0} elements are not a multiple of the {type_name} block of {block}"
        )
    n_bytes = n_elements // block * type_size
    return rel_offset, TensorInfo(name, tuple(dims), ggml_type, type_name, 0, n_bytes)


def _read_header(cur: _Cursor, file_size: int, limits: HeaderLimits) -> GGUFHeader:
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
    budget = [limits.max_array_elements_total]
    for i in range(n_kv):
        start = cur.pos
        key = cur.string(f"key of metadata entry {i}", limits.max_string_bytes)
        if key in metadata:
            raise InvalidGGUF(f"duplicate metadata key {key!r} at byte {start}")
        vtype = cur.u32(f"value type of {key!r}")
        metadata[key] = value = _read_value(cur, vtype, f"value of {key!r}", limits, budget)
        if key == "general.alignment":
            if vtype != _T_UINT32 or not isinstance(value, int):
                raise InvalidGGUF(f"general.alignment at byte {start} must be a uint32")
            if value == 0 or value & (value - 1):
                raise InvalidGGUF(f"general.alignment {value} at byte {start} is not a power of 2")
            alignment = value

    raw: list[tuple[int, TensorInfo]] = []
    names: set[str] = set()
    for i in range(n_tensors):
        start = cur.pos
        rel_offset, info = _read_tensor_info(cur, i, limits)
        if info.name in names:
            raise InvalidGGUF(f"duplicate tensor name {info.name!r} at byte {start}")
        names.add(info.name)
        raw.append((rel_offset, info))

    data_offset = -(-cur.pos // alignment) * alignment
    tensors: list[TensorInfo] = []
    for rel_offset, info in raw:
        if rel_offset % alignment:
            raise InvalidGGUF(
                f"tensor {info.name!r} data offset {rel_offset} is not aligned to {alignment}"
            )
        offset = data_offset + rel_offset
        if offset + info.n_bytes > file_size:
            raise InvalidGGUF(
                f"tensor {info.name!r} data [{offset}, {offset + info.n_bytes}) lies beyond "
                f"the end of the {file_size}-byte file"
            )
        tensors.append(
            TensorInfo(info.name, info.dims, info.ggml_type, info.type_name, offset, info.n_bytes)
        )
    return GGUFHeader(version, alignment, metadata, tuple(tensors), data_offset, file_size)


def read_header(
    fileobj: BinaryIO, *, file_size: int, limits: HeaderLimits = HeaderLimits()
) -> GGUFHeader:
    """Parse and validate the header that starts at ``fileobj``'s current position.

    ``file_size`` is the size of the whole file. Raises InvalidGGUF for any defect; I/O
    errors from ``fileobj`` propagate unchanged.
    """
    if file_size < 0:
        raise ValueError(f"file_size must be >= 0, got {file_size}")
    cur = _Cursor(fileobj, file_size, limits)
    try:
        return _read_header(cur, file_size, limits)
    except InvalidGGUF:
        raise
    except (struct.error, UnicodeDecodeError, OverflowError, MemoryError) as e:
        raise InvalidGGUF(f"malformed header near byte {cur.pos}: {e}") from e


def _opt_int(md: Mapping[str, object], key: str) -> int | None:
    value = md.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidGGUF(f"metadata {key!r} should be an integer, got {type(value).__name__}")


def _opt_str(md: Mapping[str, object], key: str) -> str | None:
    value = md.get(key)
    if value is None or isinstance(value, str):
        return value
    raise InvalidGGUF(f"metadata {key!r} should be a string, got {type(value).__name__}")


def _per_layer(md: Mapping[str, object], key: str) -> tuple[int | None, tuple[int, ...] | None]:
    """An integer that may be given once or per layer: (maximum, per-layer values or None)."""
    value = md.get(key)
    if isinstance(value, tuple):
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise InvalidGGUF(f"metadata {key!r} should be integers, got {value[:4]!r}")
        ints = tuple(int(v) for v in value)
        return max(ints), ints
    return _opt_int(md, key), None


def facts_from_header(header: GGUFHeader) -> GGUFFacts:
    """Summarize one header. Raises InvalidGGUF when well-known keys have the wrong type."""
    md = header.metadata
    arch = _opt_str(md, "general.architecture")
    prefix = f"{arch}." if arch else "\0"  # "\0" matches no key when the arch is unknown
    n_embd = _opt_int(md, prefix + "embedding_length")
    n_head, _ = _per_layer(md, prefix + "attention.head_count")
    n_head_kv, kv_per_layer = _per_layer(md, prefix + "attention.head_count_kv")
    n_ff, _ = _per_layer(md, prefix + "feed_forward_length")
    default_head_dim = n_embd // n_head if n_embd is not None and n_head else None
    head_dim_k = _opt_int(md, prefix + "attention.key_length")
    head_dim_v = _opt_int(md, prefix + "attention.value_length")
    vocab_size = _opt_int(md, prefix + "vocab_size")
    tokens = md.get("tokenizer.ggml.tokens")
    if vocab_size is None and isinstance(tokens, tuple):
        vocab_size = len(tokens)
    file_type = _opt_int(md, "general.file_type")
    return GGUFFacts(
        architecture=arch,
        name=_opt_str(md, "general.name"),
        file_type=file_type,
        file_type_name=FILE_TYPE_NAMES.get(file_type) if file_type is not None else None,
        parameter_count=sum(t.n_elements for t in header.tensors),
        n_layer=_opt_int(md, prefix + "block_count"),
        n_ctx_train=_opt_int(md, prefix + "context_length"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv if n_head_kv is not None else n_head,
        n_head_kv_per_layer=kv_per_layer,
        head_dim_k=head_dim_k if head_dim_k is not None else default_head_dim,
        head_dim_v=head_dim_v if head_dim_v is not None else default_head_dim,
        n_ff=n_ff,
        n_expert=_opt_int(md, prefix + "expert_count"),
        n_expert_used=_opt_int(md, prefix + "expert_used_count"),
        vocab_size=vocab_size,
        split_no=_opt_int(md, KEY_SPLIT_NO),
        split_count=_opt_int(md, KEY_SPLIT_COUNT),
        split_tensors_count=_opt_int(md, KEY_SPLIT_TENSORS),
        tensor_bytes=sum(t.n_bytes for t in header.tensors),
        tensors={t.name: t.n_bytes for t in header.tensors},
    )


def check_shard_set(headers: Sequence[GGUFHeader]) -> None:
    """Raise MissingShard unless ``headers`` (any order) form one complete split set.

    A single header without split keys is a complete, unsplit model. Split keys of the
    wrong type raise InvalidGGUF.
    """
    if not headers:
        raise MissingShard("no GGUF files given")
    if len(headers) == 1 and KEY_SPLIT_COUNT not in headers[0].metadata:
        return
    nos: list[int] = []
    counts: set[int] = set()
    totals: set[int] = set()
    for i, h in enumerate(headers):
        no, count, total = (
            _opt_int(h.metadata, k) for k in (KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS)
        )
        if no is None or count is None or total is None:
            raise MissingShard(f"file {i} of the set lacks the split.no/count/tensors.count keys")
        nos.append(no)
        counts.add(count)
        totals.add(total)
    if len(counts) != 1:
        raise MissingShard(f"shards disagree on split.count: {sorted(counts)}")
    (count,) = counts
    if count < 1:
        raise MissingShard(f"split.count is {count}")
    out_of_range = sorted(n + 1 for n in nos if not 0 <= n < count)
    if out_of_range:
        raise MissingShard(f"shard number(s) {out_of_range} are outside 1..{count}")
    duplicates = sorted(n + 1 for n, c in Counter(nos).items() if c > 1)
    if duplicates:
        raise MissingShard(f"shard number(s) {duplicates} of {count} appear more than once")
    present = set(nos)
    missing = tuple(n + 1 for n in range(count) if n not in present)
    if missing:
        names = ", ".join(f"{n:05d}-of-{count:05d}" for n in missing)
        raise MissingShard(
            f"missing shard(s) {', '.join(map(str, missing))} of {count} ({names})",
            missing=missing,
        )
    if len(totals) != 1:
        raise MissingShard(f"shards disagree on split.tensors.count: {sorted(totals)}")
    (total,) = totals
    found = sum(len(h.tensors) for h in headers)
    if found != total:
        raise MissingShard(f"the shards hold {found} tensors but split.tensors.count is {total}")


def facts_from_shard_set(headers: Sequence[GGUFHeader]) -> GGUFFacts:
    """Facts of a complete shard set: metadata of shard 1, tensors of all shards."""
    check_shard_set(headers)
    ordered = sorted(headers, key=lambda h: _opt_int(h.metadata, KEY_SPLIT_NO) or 0)
    first = facts_from_header(ordered[0])
    tensors: dict[str, int] = {}
    parameter_count = 0
    for h in ordered:
        tensors.update((t.name, t.n_bytes) for t in h.tensors)
        parameter_count += sum(t.n_elements for t in h.tensors)
    return dataclasses.replace(
        first,
        parameter_count=parameter_count,
        tensor_bytes=sum(tensors.values()),
        tensors=tensors,
    )


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
