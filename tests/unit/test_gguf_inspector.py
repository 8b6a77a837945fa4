"""Tests for kama.gguf, the header inspector the planner trusts with untrusted files.

Facts are checked against the shape a model was generated from and against the gguf
package's reader; hostile and broken headers must fail fast with InvalidGGUF.
"""

from __future__ import annotations

import dataclasses
import io
import re
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import gguf
import pytest

from activities.cache import gguf_facts
from activities.gguf_files import inspect_file
from activities.import_payloads import DownloadedFile
from kama.gguf.header import GGML_TYPES, GGUFHeader, HeaderLimits, InvalidGGUF
from kama.gguf.reader import read_header
from kama.gguf.shards import (
    MissingShard,
    check_shard_set,
    facts_from_header,
    facts_from_shard_set,
    parse_shard_name,
    shard_file_names,
)
from kamadev.gguf_factory import (
    ModelShape,
    write_bad_magic,
    write_bad_tensor_offset,
    write_model,
    write_shards,
    write_truncated,
)
from tests.unit.counted_work import CountingStream, calls_until_raised

SMALL = ModelShape(n_layer=1, n_embd=32, n_head=2, n_head_kv=2, n_ff=64, vocab_extra=20)


def _header(path: Path) -> GGUFHeader:
    with open(path, "rb") as f:
        return read_header(f, file_size=path.stat().st_size)


def _parse(data: bytes, *, file_size: int | None = None) -> GGUFHeader:
    return read_header(io.BytesIO(data), file_size=len(data) if file_size is None else file_size)


def _gguf_string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _crafted(n_tensors: int, n_kv: int, body: bytes = b"", version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + body


def _expected_parameters(s: ModelShape) -> int:
    kv_dim = s.n_head_kv * s.head_dim
    per_layer = (
        2 * s.n_embd + 2 * s.n_embd * s.n_embd + 2 * kv_dim * s.n_embd + 3 * s.n_ff * s.n_embd
    )
    return 2 * s.n_vocab * s.n_embd + s.n_embd + s.n_layer * per_layer


@pytest.mark.parametrize(
    ("shape", "file_type", "name"),
    [
        (ModelShape(), 0, "F32"),
        (ModelShape(file_type="F16"), 1, "F16"),
        (ModelShape(file_type="Q8_0", n_layer=3), 7, "Q8_0"),
        (ModelShape(n_head=8, n_head_kv=2, n_embd=128, n_ctx=4096), 0, "F32"),
    ],
    ids=["f32", "f16", "q8_0", "gqa"],
)
def test_facts_match_the_generated_shape(
    tmp_path: Path, shape: ModelShape, file_type: int, name: str
) -> None:
    facts = inspect_file(write_model(tmp_path / "m.gguf", shape=shape))
    assert facts.architecture == "llama"
    assert facts.name is not None and name in facts.name
    assert (facts.file_type, facts.file_type_name) == (file_type, name)
    assert facts.n_layer == shape.n_layer
    assert facts.n_ctx_train == shape.n_ctx
    assert facts.n_embd == shape.n_embd
    assert facts.n_head == shape.n_head
    assert facts.n_head_kv == shape.n_head_kv
    assert facts.n_head_kv_per_layer is None
    assert facts.head_dim_k == facts.head_dim_v == shape.n_embd // shape.n_head
    assert facts.n_ff == shape.n_ff
    assert facts.n_expert is None and facts.n_expert_used is None
    assert facts.vocab_size == 3 + 256 + shape.vocab_extra
    assert facts.parameter_count == _expected_parameters(shape)
    assert facts.split_no is facts.split_count is facts.split_tensors_count is None
    assert len(facts.tensors) == 2 + 1 + 9 * shape.n_layer
    assert facts.tensor_bytes == sum(facts.tensors.values())


def test_tensor_sizes_and_offsets_agree_with_gguf_reader(tmp_path: Path) -> None:
    for file_type in ("F32", "F16", "Q8_0"):
        path = write_model(tmp_path / f"{file_type}.gguf", shape=ModelShape(file_type=file_type))
        header = _header(path)
        reader = gguf.GGUFReader(path)
        assert header.data_offset == reader.data_offset
        assert header.alignment == reader.alignment == 32
        assert header.version == 3
        assert [(t.name, t.n_bytes, t.offset) for t in header.tensors] == [
            (t.name, int(t.n_bytes), int(t.data_offset)) for t in reader.tensors
        ]
        assert [t.dims for t in header.tensors] == [
            tuple(int(d) for d in t.shape) for t in reader.tensors
        ]
        assert [t.type_name for t in header.tensors] == [t.tensor_type.name for t in reader.tensors]
        q8 = next(t for t in header.tensors if t.name == "output.weight")
        per_element = {"F32": 4.0, "F16": 2.0, "Q8_0": 34 / 32}[file_type]
        assert q8.n_bytes == q8.n_elements * per_element


def test_type_table_matches_gguf_package() -> None:
    for ggml_type, (name, block, size) in GGML_TYPES.items():
        q = gguf.GGMLQuantizationType(ggml_type)
        assert q.name == name
        assert gguf.GGML_QUANT_SIZES[q] == (block, size)


def test_metadata_values_round_trip(tmp_path: Path) -> None:
    header = _header(write_model(tmp_path / "m.gguf", shape=SMALL))
    md = header.metadata
    tokens = md["tokenizer.ggml.tokens"]
    assert isinstance(tokens, tuple) and tokens[:3] == ("<unk>", "<s>", "</s>")
    assert md["tokenizer.ggml.add_bos_token"] is True
    assert md["llama.rope.freq_base"] == 10000.0
    assert isinstance(md["tokenizer.chat_template"], str)


class _CountingReader(io.BytesIO):
    """Remembers the furthest byte read, to prove tensor data is never touched."""

    furthest = 0

    def read(self, n: int | None = -1, /) -> bytes:
        data = super().read(n)
        self.furthest = max(self.furthest, self.tell())
        return data


def test_never_reads_tensor_data(tmp_path: Path) -> None:
    data = write_model(tmp_path / "m.gguf", shape=SMALL).read_bytes()
    f = _CountingReader(data)
    header = read_header(f, file_size=len(data))
    assert f.furthest <= header.data_offset < len(data)


@pytest.mark.parametrize(
    ("writer", "match"),
    [
        (write_bad_magic, "bad magic"),
        (write_truncated, "byte"),
        (write_bad_tensor_offset, "beyond the end"),
    ],
)
def test_broken_files_raise_invalid_gguf(
    tmp_path: Path, writer: Callable[..., Path], match: str
) -> None:
    path = writer(tmp_path / "broken.gguf", shape=SMALL)
    with pytest.raises(InvalidGGUF, match=match):
        inspect_file(path)


def test_truncation_anywhere_raises(tmp_path: Path) -> None:
    data = write_model(tmp_path / "m.gguf", shape=SMALL).read_bytes()
    header = _parse(data)
    for cut in (0, 3, 10, 30, header.data_offset // 2, header.data_offset - 1, len(data) - 1):
        with pytest.raises(InvalidGGUF):
            _parse(data[:cut])


def test_stream_shorter_than_file_size_raises(tmp_path: Path) -> None:
    data = write_model(tmp_path / "m.gguf", shape=SMALL).read_bytes()
    with pytest.raises(InvalidGGUF, match="end of file"):
        _parse(data[:100], file_size=len(data))


@pytest.mark.parametrize("version", [1, 4, 0x03000000])
def test_unsupported_versions(tmp_path: Path, version: int) -> None:
    data = bytearray(write_model(tmp_path / "m.gguf", shape=SMALL).read_bytes())
    data[4:8] = struct.pack("<I", version)
    with pytest.raises(InvalidGGUF, match=f"version {version}"):
        _parse(bytes(data))


# A hostile header is refused after a few reads of its first bytes: the parser checks
# each claimed length and count before it reads, allocates or loops over what it claims.
FAIL_FAST_READS = 32  # the worst case here takes 12
FAIL_FAST_CALLS = 500  # and 88 calls


def _fails_fast(data: bytes, match: str, *, file_size: int | None = None) -> None:
    stream = CountingStream(io.BytesIO(data))
    size = len(data) if file_size is None else file_size
    raised, calls = calls_until_raised(lambda: read_header(stream, file_size=size), InvalidGGUF)
    assert re.search(match, str(raised)), raised
    assert stream.reads <= FAIL_FAST_READS and calls <= FAIL_FAST_CALLS, (stream.reads, calls)


def test_hostile_counts_and_lengths_fail_fast() -> None:
    key = _gguf_string(b"k")
    # A 2**60-byte key, checked against the file and, for a lying file_size, the cap.
    huge_key = struct.pack("<Q", 2**60) + b"\0" * 32
    _fails_fast(_crafted(0, 1, huge_key), "claims")
    _fails_fast(_crafted(0, 1, huge_key), "claims", file_size=2**62)
    # A string value longer than what is left of the file.
    _fails_fast(_crafted(0, 1, key + struct.pack("<IQ", 8, 5000) + b"x" * 10), "needs 5000 bytes")
    # Arrays with absurd element counts.
    huge_array = key + struct.pack("<IIQ", 9, 4, 2**62)
    _fails_fast(_crafted(0, 1, huge_array), "elements")
    _fails_fast(_crafted(0, 1, huge_array), "elements", file_size=2**62)
    small_claim = key + struct.pack("<IIQ", 9, 8, 1000) + b"\0" * 64
    _fails_fast(_crafted(0, 1, small_claim), "more than the")
    # Tensor and metadata counts.
    _fails_fast(_crafted(2**63, 0), "tensor count")
    _fails_fast(_crafted(0, 2**40), "metadata count")
    _fails_fast(_crafted(1000, 1000, b"\0" * 100), "cannot fit")


def test_malformed_entries() -> None:
    key = _gguf_string(b"k")
    _fails_fast(_crafted(0, 1, key + struct.pack("<I", 13) + b"\0" * 8), "unknown value type 13")
    _fails_fast(_crafted(0, 1, key + struct.pack("<IIQ", 9, 9, 1) + b"\0" * 32), "unsupported type")
    _fails_fast(_crafted(0, 1, _gguf_string(b"\xff\xfe") + struct.pack("<IB", 0, 1)), "UTF-8")
    dup = (key + struct.pack("<IB", 0, 1)) * 2
    _fails_fast(_crafted(0, 2, dup), "duplicate metadata key")
    for alignment, vtype, fmt in ((3, 4, "<I"), (0, 4, "<I"), (64, 10, "<Q")):
        kv = (
            _gguf_string(b"general.alignment")
            + struct.pack("<I", vtype)
            + struct.pack(fmt, alignment)
        )
        _fails_fast(_crafted(0, 1, kv), "general.alignment")


def _tensor_file(*infos: tuple[bytes, int, tuple[int, ...], int, int], data: int = 4096) -> bytes:
    body = b""
    for name, n_dims, dims, ggml_type, offset in infos:
        body += _gguf_string(name) + struct.pack("<I", n_dims)
        body += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ggml_type, offset)
    header = _crafted(len(infos), 0, body)
    header += b"\0" * (-len(header) % 32)
    return header + b"\0" * data


def test_tensor_info_checks() -> None:
    ok = _parse(_tensor_file((b"a", 2, (32, 2), 8, 0), (b"b", 1, (8,), 0, 96)))
    assert [(t.name, t.n_bytes, t.type_name) for t in ok.tensors] == [
        ("a", 68, "Q8_0"),
        ("b", 32, "F32"),
    ]
    assert ok.tensors[1].offset == ok.data_offset + 96
    _fails_fast(_tensor_file((b"a", 5, (1, 1, 1, 1, 1), 0, 0)), "5 dimensions")
    _fails_fast(_tensor_file((b"a", 1, (4,), 4, 0)), "unknown ggml type 4")
    _fails_fast(_tensor_file((b"a", 1, (33,), 8, 0)), "not a multiple")
    _fails_fast(_tensor_file((b"a", 1, (4,), 0, 16)), "not aligned")
    _fails_fast(_tensor_file((b"a", 1, (4,), 0, 0), (b"a", 1, (4,), 0, 32)), "duplicate tensor")
    _fails_fast(_tensor_file((b"a", 4, (2**32, 2**32, 2**32, 1), 0, 0)), "overflows")
    _fails_fast(_tensor_file((b"a", 2, (1024, 1024), 0, 0)), "beyond the end")
    _fails_fast(_tensor_file((b"x" * 64, 1, (4,), 0, 0)), "over the 63 limit")


def test_header_byte_limit() -> None:
    body = _gguf_string(b"k") + struct.pack("<I", 8) + _gguf_string(b"v" * 5000)
    limits = HeaderLimits(max_header_bytes=1000)
    with pytest.raises(InvalidGGUF, match="1000-byte limit"):
        read_header(io.BytesIO(_crafted(0, 1, body)), file_size=10_000, limits=limits)


def _shards(tmp_path: Path, n: int) -> list[GGUFHeader]:
    return [_header(p) for p in write_shards(tmp_path, stem="m", shape=SMALL, n_shards=n)]


def test_complete_shard_set_passes_and_merges(tmp_path: Path) -> None:
    headers = _shards(tmp_path, 3)
    check_shard_set(headers)
    check_shard_set(list(reversed(headers)))
    facts = facts_from_shard_set(list(reversed(headers)))
    single = inspect_file(write_model(tmp_path / "single.gguf", shape=SMALL))
    assert facts.parameter_count == single.parameter_count == _expected_parameters(SMALL)
    assert facts.tensors == single.tensors
    assert (facts.split_no, facts.split_count, facts.split_tensors_count) == (
        0,
        3,
        len(single.tensors),
    )
    assert facts.n_layer == SMALL.n_layer and facts.architecture == "llama"


@pytest.mark.parametrize("no", [0, 1, 2])
def test_a_lone_shard_is_not_a_model(tmp_path: Path, no: int) -> None:
    """One file that says it is shard k of 3 is not a complete model, whichever k."""
    path = write_shards(tmp_path, stem="m", shape=SMALL, n_shards=3)[no]
    missing = tuple(n for n in (1, 2, 3) if n != no + 1)
    for inspect in (
        lambda: facts_from_header(_header(path)),
        lambda: inspect_file(path),
        lambda: gguf_facts(
            tmp_path, [DownloadedFile(path=path.name, size=path.stat().st_size, sha256="0" * 64)]
        ),
    ):
        with pytest.raises(MissingShard, match="missing shard") as info:
            inspect()
        assert info.value.missing == missing


def test_a_one_file_split_set_is_a_model(tmp_path: Path) -> None:
    (path,) = write_shards(tmp_path, stem="m", shape=SMALL, n_shards=1)
    facts = inspect_file(path)
    assert (facts.split_no, facts.split_count) == (0, 1) and facts.n_layer == SMALL.n_layer


def test_single_unsplit_file_is_a_complete_set(tmp_path: Path) -> None:
    check_shard_set([_header(write_model(tmp_path / "m.gguf", shape=SMALL))])


@pytest.mark.parametrize(("drop", "missing"), [(0, "1"), (1, "2"), (3, "4")])
def test_missing_shard_is_named(tmp_path: Path, drop: int, missing: str) -> None:
    headers = _shards(tmp_path, 4)
    del headers[drop]
    with pytest.raises(MissingShard, match=f"missing shard\\(s\\) {missing} of 4") as info:
        check_shard_set(headers)
    assert info.value.missing == (int(missing),)
    assert not isinstance(info.value, InvalidGGUF)


def test_inconsistent_shard_sets(tmp_path: Path) -> None:
    (tmp_path / "three").mkdir()
    (tmp_path / "two").mkdir()
    three = _shards(tmp_path / "three", 3)
    two = _shards(tmp_path / "two", 2)
    with pytest.raises(MissingShard, match=r"disagree on split\.count"):
        check_shard_set([three[0], two[1], three[2]])
    with pytest.raises(MissingShard, match="more than once"):
        check_shard_set([three[0], three[1], three[1]])
    with pytest.raises(MissingShard, match="no GGUF files"):
        check_shard_set([])
    plain = _header(write_model(tmp_path / "plain.gguf", shape=SMALL))
    with pytest.raises(MissingShard, match="lacks the split"):
        check_shard_set([three[0], plain])
    short = dataclasses.replace(three[2], tensors=three[2].tensors[:-1])
    with pytest.raises(MissingShard, match=r"split\.tensors\.count"):
        check_shard_set([three[0], three[1], short])


def test_shard_names() -> None:
    names = shard_file_names("Qwen3-8B-Q4_K_M", 3)
    assert names == [f"Qwen3-8B-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert [parse_shard_name(n) for n in names] == [("Qwen3-8B-Q4_K_M", i, 3) for i in (1, 2, 3)]
    assert parse_shard_name("models/x-00002-of-00010.gguf") == ("x", 2, 10)
    for bad in (
        "x.gguf",
        "x-00000-of-00003.gguf",
        "x-00004-of-00003.gguf",
        "x-1-of-3.gguf",
        "-00001-of-00001.gguf",
    ):
        assert parse_shard_name(bad) is None, bad
    with pytest.raises(ValueError):
        shard_file_names("x", 0)


def _iter_chunks(f: BinaryIO) -> Iterator[bytes]:
    while chunk := f.read(7):
        yield chunk


class _TrickleReader(io.RawIOBase):
    """A stream that returns at most 7 bytes per read, like a slow socket."""

    def __init__(self, data: bytes) -> None:
        self._chunks = _iter_chunks(io.BytesIO(data))
        self._pending = b""

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1, /) -> bytes:
        if not self._pending:
            self._pending = next(self._chunks, b"")
        out, self._pending = self._pending[:n], self._pending[n:]
        return out


def test_short_reads_are_retried(tmp_path: Path) -> None:
    data = write_model(tmp_path / "m.gguf", shape=SMALL).read_bytes()
    header = read_header(_TrickleReader(data), file_size=len(data))
    assert header == _parse(data)
