"""Bounded, pure parser for GGUF file headers: bytes in, a ``GGUFHeader`` out.

Before Kama schedules a llama-server it must know what a model file is and whether it
is a well-formed GGUF at all. Model files come from untrusted places, so this parser
treats every header as hostile: each length and count is capped (``HeaderLimits``) and
checked against the bytes actually left in the file before anything is allocated, and
every defect surfaces as one typed error, ``InvalidGGUF``, that says what is wrong and
at which byte offset (or which metadata key).

The caps sit a few times above the largest real models, so that the worst header they
allow still parses in about a second with tens of MiB: long arrays (token lists, merges)
are walked without being kept. What the header says is summarized, bounded the same
way, by ``kama.gguf.facts``; a shard set is merged one header at a time by
``kama.gguf.shards``.

It reads the header sequentially from the stream's current position (which must be
the start of the file) through its ``read`` alone, never seeks and never reads past
the header, so it works on a local file as well as on a stream such as an HTTP range
response; whoever opens the file (``activities.gguf_files``) hands it over. No I/O of
its own, no network access, no dependency on the ``gguf`` package. Byte order:
little-endian GGUF v2 and v3 only.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from kama.gguf.header import (
    DEFAULT_LIMITS,
    GGML_TYPES,
    GGUFHeader,
    HeaderLimits,
    InvalidGGUF,
    SkippedArray,
    TensorInfo,
)

__all__ = ["ByteStream", "read_header"]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_INT64_MAX = 2**63 - 1
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset
_SKIP_CHUNK = 1 << 16  # bytes read at a time while walking data that is not kept

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


class ByteStream(Protocol):
    """What the parser reads from: a binary file, a socket's file object, ``io.BytesIO``.
    ``read(n)`` returns at most ``n`` bytes, fewer only at the end of the stream or when
    the stream has no more yet (the parser asks again), and ``b""`` at its end."""

    def read(self, n: int, /) -> bytes: ...


class _Cursor:
    """Exact, bounded sequential reads; every failure is an InvalidGGUF naming the offset.

    ``what`` is a fixed description: hot loops pass constant strings and add context
    only when something fails, so the common path formats nothing.
    """

    def __init__(self, *, fileobj: ByteStream, file_size: int, limits: HeaderLimits) -> None:
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
    fileobj: ByteStream, *, file_size: int, limits: HeaderLimits = DEFAULT_LIMITS
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
