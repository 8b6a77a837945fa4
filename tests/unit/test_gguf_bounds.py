"""Bounds on what a GGUF header may make Kama do.

A model file is untrusted input that reaches the importer before anything else looks at
it, so two things are pinned down here: every fact the planner reads is typed and lies
near real models' maxima (a 100-byte file must not claim 2**26 layers and make the
status allocate a list per layer), and the worst header the parser's caps allow still
parses with a bounded amount of work and memory (token lists and merges are walked,
not kept; a shard set is read one header at a time). Work is counted, not timed (issue
#40: on a CI machine busy with stack tests a parse of 65,536 tensors took 8 s instead
of well under one): the reads of the file, the bytes they return and the function calls
made, each a fixed amount per record of the header. How fast the parser runs is
measured in tests/bench/bench_gguf_parse.py.
"""

from __future__ import annotations

import dataclasses
import io
import re
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from gguf import GGUFValueType as VT

from activities.cache import gguf_facts
from activities.gguf_files import inspect_file, inspect_files
from activities.import_payloads import DownloadedFile
from kama.api import GGUFInfo
from kama.api import gguf_bounds as g
from kama.gguf.header import GGUFHeader, HeaderLimits, InvalidGGUF
from kama.gguf.reader import _SKIP_CHUNK, read_header
from kama.gguf.shards import MissingShard
from kamadev.gguf_factory import (
    raw_array_kv,
    raw_gguf,
    raw_kv,
    raw_string,
    raw_tensor_info,
    write_raw,
)
from tests.unit.counted_work import CountingStream, calls_until_raised, counted

T = TypeVar("T")
LIMITS = HeaderLimits()
MAX_PEAK = 100 << 20  # what tracemalloc sees allocated at once, per header
# The work of one record of the header (a metadata entry or a tensor info): 4 or 5
# reads and 28-29 calls with CPython 3.11. A parse that did more per record, or read
# a record one field at a time, is over these at any size.
READS_PER_RECORD = 5
CALLS_PER_RECORD = 40
FIXED_READS = 16  # the magic, version and counts, and a little slack
FIXED_CALLS = 2000  # the same, and the first use of each struct format


def _llama(*kvs: bytes, tensor_infos: list[bytes] | None = None, data_bytes: int = 0) -> bytes:
    arch = raw_kv("general.architecture", VT.STRING, "llama")
    return raw_gguf(kvs=[arch, *kvs], tensor_infos=tensor_infos, data_bytes=data_bytes)


def _key(key: str) -> str:
    """A pattern for an error message that names ``key`` as the inspector quotes it."""
    return re.escape(repr(key))


def _facts_of(tmp_path: Path, data: bytes) -> dict[str, object]:
    """What the publish activity stores in the status: gguf_facts on a staged file."""
    write_raw(tmp_path / "m.gguf", data)
    return gguf_facts(tmp_path, [DownloadedFile(path="m.gguf", size=len(data), sha256="0" * 64)])


@dataclasses.dataclass(frozen=True)
class Work:
    """What one parse cost: calls made, reads of the file and the bytes they returned."""

    calls: int
    reads: int
    bytes_read: int


def _work(path: Path) -> tuple[GGUFHeader, Work]:
    """The header of `path` and the work its parse took (time is not measured here)."""
    stream = CountingStream(io.BytesIO(path.read_bytes()))
    header, calls = counted(lambda: read_header(stream, file_size=path.stat().st_size))
    return header, Work(calls=calls, reads=stream.reads, bytes_read=stream.bytes_read)


def _assert_bounded_work(header: GGUFHeader, work: Work) -> None:
    """Each byte of the header read once and nothing past it, a fixed number of reads
    and calls per record: the work of the largest header the caps allow is bounded."""
    records = len(header.metadata) + len(header.tensors)
    assert header.data_offset - header.alignment < work.bytes_read <= header.data_offset, (
        work,
        header.data_offset,
    )
    assert work.reads <= READS_PER_RECORD * records + FIXED_READS, (work, records)
    assert work.calls <= CALLS_PER_RECORD * records + FIXED_CALLS, (work, records)


def _peak(parse: Callable[[], T]) -> tuple[T, int]:
    """The result and the most bytes allocated at once while computing it (tracemalloc
    slows allocation-heavy code ~10x, so time is measured on a separate run)."""
    tracemalloc.start()
    try:
        result = parse()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


def _parse_file(path: Path) -> GGUFHeader:
    with path.open("rb") as f:
        return read_header(f, file_size=path.stat().st_size)


# Facts --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "vtype", "value"),
    [
        ("llama.block_count", VT.UINT32, 2**26),
        ("llama.block_count", VT.UINT64, 2**40),
        ("llama.block_count", VT.UINT64, 2**63),
        ("llama.block_count", VT.INT32, -1),
        ("llama.context_length", VT.INT32, -1),
        ("llama.context_length", VT.UINT64, 2**40),
        ("llama.attention.head_count", VT.INT32, -8),
        ("llama.attention.head_count", VT.UINT32, 2**20),
        ("llama.attention.head_count_kv", VT.INT64, -1),
        ("llama.attention.key_length", VT.INT32, -128),
        ("llama.embedding_length", VT.UINT64, 2**40),
        ("llama.feed_forward_length", VT.INT32, -1),
        ("llama.expert_count", VT.UINT32, 100_000),
        ("llama.vocab_size", VT.UINT64, 2**32),
        ("general.file_type", VT.INT32, -1),
        ("split.count", VT.UINT32, 2**31),
        ("split.tensors.count", VT.INT32, -1),
    ],
)
def test_out_of_range_facts_are_invalid_gguf_naming_the_key(
    tmp_path: Path, key: str, vtype: VT, value: int
) -> None:
    path = write_raw(tmp_path / "m.gguf", _llama(raw_kv(key, vtype, value)))
    # refused from the value alone: nothing allocated or done per claimed layer
    (raised, calls), peak = _peak(
        lambda: calls_until_raised(lambda: inspect_file(path), InvalidGGUF)
    )
    assert re.search(_key(key), str(raised)), raised
    assert calls < 1000 and peak < 1 << 20, (calls, peak)  # ~100 calls and ~20 KiB here


@pytest.mark.parametrize(
    "entry",
    [
        raw_kv("llama.block_count", VT.FLOAT32, 32.0),
        raw_kv("llama.block_count", VT.BOOL, True),
        raw_kv("llama.block_count", VT.STRING, "32"),
        raw_array_kv("llama.block_count", VT.UINT32, count=1, payload=struct.pack("<I", 32)),
        raw_kv("general.architecture", VT.UINT32, 7),
        raw_kv("general.architecture", VT.STRING, "x" * 129),
        raw_kv("general.architecture", VT.STRING, "llama\n"),
        raw_kv("general.name", VT.UINT8, 1),
        raw_array_kv("llama.attention.head_count_kv", VT.STRING, count=1, payload=raw_string("8")),
        raw_array_kv("llama.attention.head_count_kv", VT.FLOAT32, count=1, payload=b"\0" * 4),
    ],
    ids=[
        "float-layers",
        "bool-layers",
        "string-layers",
        "array-layers",
        "int-arch",
        "long-arch",
        "newline-arch",
        "int-name",
        "string-heads",
        "float-heads",
    ],
)
def test_mistyped_facts_are_invalid_gguf(tmp_path: Path, entry: bytes) -> None:
    kvs = [entry] if entry.startswith(raw_string("general.architecture")) else None
    data = raw_gguf(kvs=kvs) if kvs else _llama(entry)
    with pytest.raises(InvalidGGUF, match="metadata '"):
        inspect_file(write_raw(tmp_path / "m.gguf", data))


def test_per_layer_values_must_match_the_layer_count(tmp_path: Path) -> None:
    layers = raw_kv("llama.block_count", VT.UINT32, 4)
    for count, values in ((3, (8, 8, 8)), (5, (8,) * 5), (4, (8, 8, -1, 8))):
        heads = raw_array_kv(
            "llama.attention.head_count_kv",
            VT.INT32,
            count=count,
            payload=struct.pack(f"<{count}i", *values),
        )
        with pytest.raises(InvalidGGUF, match=_key("llama.attention.head_count_kv")):
            inspect_file(write_raw(tmp_path / "m.gguf", _llama(layers, heads)))
    # Longer than the kept-array cap: never materialised, still refused by name.
    long = raw_array_kv(
        "llama.attention.head_count_kv", VT.UINT8, count=1 << 20, payload=b"\x08" * (1 << 20)
    )
    with pytest.raises(InvalidGGUF, match=_key("llama.attention.head_count_kv")):
        inspect_file(write_raw(tmp_path / "m.gguf", _llama(layers, long)))


@pytest.mark.parametrize("value", [2**40, 2**63, -1], ids=["2^40", "2^63", "negative"])
def test_gguf_facts_refuses_hostile_layer_counts_as_invalid_gguf(
    tmp_path: Path, value: int
) -> None:
    """Before the bounds these escaped publish as MemoryError, OverflowError or a
    pydantic ValidationError: retried forever instead of failing the import."""
    vtype = VT.INT64 if value < 0 else VT.UINT64
    with pytest.raises(InvalidGGUF, match=_key("llama.block_count")):
        _facts_of(tmp_path, _llama(raw_kv("llama.block_count", vtype, value)))


def test_facts_at_every_bound_still_make_a_status(tmp_path: Path) -> None:
    """What the inspector accepts, GGUFInfo accepts: no ValidationError at the edges."""
    n = g.MAX_LAYERS
    data = _llama(
        raw_kv("general.file_type", VT.UINT32, g.MAX_FILE_TYPE),
        raw_kv("llama.block_count", VT.UINT32, n),
        raw_kv("llama.context_length", VT.UINT64, g.MAX_CONTEXT),
        raw_kv("llama.embedding_length", VT.UINT64, g.MAX_WIDTH),
        raw_kv("llama.feed_forward_length", VT.UINT64, g.MAX_WIDTH),
        raw_kv("llama.attention.head_count", VT.UINT32, g.MAX_HEADS),
        raw_array_kv(
            "llama.attention.head_count_kv",
            VT.UINT32,
            count=n,
            payload=struct.pack(f"<{n}I", *[g.MAX_HEADS] * n),
        ),
        raw_kv("llama.attention.key_length", VT.UINT32, g.MAX_WIDTH),
        raw_kv("llama.attention.value_length", VT.UINT32, g.MAX_WIDTH),
        raw_kv("llama.expert_count", VT.UINT32, g.MAX_EXPERTS),
        raw_kv("llama.expert_used_count", VT.UINT32, g.MAX_EXPERTS),
        raw_kv("llama.vocab_size", VT.UINT32, g.MAX_VOCAB),
        tensor_infos=[raw_tensor_info(f"blk.{n - 1}.w", (8,), 0, 0)],
        data_bytes=32,
    )
    info = GGUFInfo.model_validate(_facts_of(tmp_path, data))
    assert info.layers == n and info.head_count_kv_per_layer == [g.MAX_HEADS] * n
    assert info.weights is not None and info.weights.layers[-1] == 32
    assert info.context_length == g.MAX_CONTEXT and info.expert_count == g.MAX_EXPERTS


def test_more_experts_used_than_exist_is_invalid(tmp_path: Path) -> None:
    data = _llama(
        raw_kv("llama.expert_count", VT.UINT32, 8),
        raw_kv("llama.expert_used_count", VT.UINT32, 9),
    )
    with pytest.raises(InvalidGGUF, match=_key("llama.expert_used_count")):
        inspect_file(write_raw(tmp_path / "m.gguf", data))


# The worst header the caps allow ------------------------------------------------------


def _tensors_at_the_cap(tmp_path: Path, *, name_len: int, n_dims: int, fill: bool = False) -> Path:
    """As many tensor infos as the cap allows; with ``fill``, the rest of the header's
    byte cap is taken by the longest strings allowed (which are kept)."""
    dims = (32,) + (1,) * (n_dims - 1)
    infos = [
        raw_tensor_info(f"{i:x}".rjust(name_len, "t"), dims, 0, 0)
        for i in range(LIMITS.max_tensor_count)
    ]
    size = LIMITS.max_string_bytes
    room = LIMITS.max_header_bytes - sum(map(len, infos)) - 1024
    kvs = [raw_kv(f"s.{i}", VT.STRING, "x" * size) for i in range(room // (size + 32))]
    data = _llama(*kvs if fill else [], tensor_infos=infos, data_bytes=128)
    return write_raw(tmp_path / "m.gguf", data)


def test_most_tensors_the_caps_allow_parse_in_bounded_work(tmp_path: Path) -> None:
    """The issue's case: short tensor infos, as many as the cap allows (2**20 took 12.8 s;
    the cap bounds the count, the parse a fixed amount of work per tensor)."""
    path = _tensors_at_the_cap(tmp_path, name_len=8, n_dims=1)
    header, work = _work(path)
    assert len(header.tensors) == LIMITS.max_tensor_count
    _assert_bounded_work(header, work)
    with pytest.raises(InvalidGGUF, match="tensor count"):
        n = LIMITS.max_tensor_count + 1
        _parse_file(write_raw(tmp_path / "over.gguf", raw_gguf(kvs=[], n_tensors=n)))


def test_the_worst_header_the_caps_allow_stays_small(tmp_path: Path) -> None:
    """The most and longest tensor infos plus strings up to the byte cap: ~81 MiB."""
    path = _tensors_at_the_cap(tmp_path, name_len=LIMITS.max_tensor_name_bytes, n_dims=4, fill=True)
    header, work = _work(path)
    _assert_bounded_work(header, work)
    facts, peak = _peak(lambda: inspect_file(path))  # the header and the facts from it
    assert len(facts.tensors) == LIMITS.max_tensor_count
    assert peak < MAX_PEAK, f"took {peak / 2**20:.0f} MiB"


def test_longest_token_list_is_walked_not_kept(tmp_path: Path) -> None:
    def tokens(n: int) -> Path:
        entry = raw_array_kv(
            "tokenizer.ggml.tokens", VT.STRING, count=n, payload=raw_string("tok") * n
        )
        return write_raw(tmp_path / f"{n}.gguf", _llama(entry))

    n = min(LIMITS.max_array_len, LIMITS.max_array_elements_total)
    header, work = _work(tokens(n))
    assert not isinstance(header.metadata["tokenizer.ggml.tokens"], tuple), "tokens were kept"
    # walked in chunks: one call a token to unpack its length from a chunk read ahead
    # (a string read at a time is 2 reads and ~15 calls a token), a few reads a chunk
    assert work.calls < 2 * n, f"{n} tokens took {work.calls} calls"
    assert work.reads <= 3 * (header.data_offset // _SKIP_CHUNK) + FIXED_READS, work
    assert work.bytes_read <= header.data_offset, work
    assert inspect_file(tmp_path / f"{n}.gguf").vocab_size == n
    # Nothing per token stays in memory, not even for a while: a quarter of the list
    # (traced, so slower) peaks far below what 262,144 kept strings would take (~15 MiB).
    small = tokens(n // 4)
    _, peak = _peak(lambda: _parse_file(small))
    assert peak < 1 << 20, f"{n // 4} tokens took {peak / 2**20:.1f} MiB"


def test_a_real_sized_vocabulary_fits_the_caps(tmp_path: Path) -> None:
    """Gemma 3's 262,144 tokens with scores and types, plus a 500k-merge BPE list."""
    n, merges = 262_144, 500_000
    data = _llama(
        raw_array_kv("tokenizer.ggml.tokens", VT.STRING, count=n, payload=raw_string("▁tok") * n),
        raw_array_kv("tokenizer.ggml.scores", VT.FLOAT32, count=n, payload=b"\0" * 4 * n),
        raw_array_kv("tokenizer.ggml.token_type", VT.INT32, count=n, payload=b"\1\0\0\0" * n),
        raw_array_kv(
            "tokenizer.ggml.merges", VT.STRING, count=merges, payload=raw_string("a b") * merges
        ),
    )
    facts = inspect_file(write_raw(tmp_path / "m.gguf", data))
    assert facts.vocab_size == n


def test_all_arrays_together_are_capped(tmp_path: Path) -> None:
    per = LIMITS.max_array_elements_total // 4
    arrays = [raw_array_kv(f"a.{i}", VT.UINT8, count=per, payload=b"\0" * per) for i in range(4)]
    header = _parse_file(write_raw(tmp_path / "ok.gguf", _llama(*arrays)))
    assert all(not isinstance(header.metadata[f"a.{i}"], tuple) for i in range(4))
    one_more = raw_array_kv("a.4", VT.UINT8, count=1, payload=b"\0")
    with pytest.raises(InvalidGGUF, match="all arrays together"):
        _parse_file(write_raw(tmp_path / "over.gguf", _llama(*arrays, one_more)))


def test_many_short_arrays_are_not_all_kept(tmp_path: Path) -> None:
    """Short arrays are kept as tuples (per-layer values), but only up to a budget: a
    header of many short arrays of large integers would otherwise cost ~9x its size."""
    n = LIMITS.max_kept_array_len
    count = LIMITS.max_array_elements_total // n
    payload = struct.pack(f"<{n}I", *range(1 << 20, (1 << 20) + n))
    arrays = [raw_array_kv(f"a.{i}", VT.UINT32, count=n, payload=payload) for i in range(count)]
    path = write_raw(tmp_path / "m.gguf", _llama(*arrays))
    header, peak = _peak(lambda: _parse_file(path))
    kept = sum(isinstance(v, tuple) for v in header.metadata.values())
    assert kept * n <= LIMITS.max_kept_elements_total
    assert isinstance(header.metadata["a.0"], tuple) and len(header.metadata["a.0"]) == n
    assert peak < 32 << 20, f"took {peak / 2**20:.0f} MiB"


def test_most_metadata_entries_the_caps_allow(tmp_path: Path) -> None:
    n = LIMITS.max_kv_count - 1
    kvs = [raw_kv(f"k.{i}", VT.UINT32, 1 << 20) for i in range(n)]
    path = write_raw(tmp_path / "m.gguf", _llama(*kvs))
    header, work = _work(path)
    _assert_bounded_work(header, work)
    header, peak = _peak(lambda: _parse_file(path))
    assert len(header.metadata) == n + 1
    assert peak < MAX_PEAK, peak


def test_largest_header_of_long_strings(tmp_path: Path) -> None:
    """Strings are kept (chat templates), so a header of the longest strings the byte
    cap allows costs about the header's size, and no more."""
    size = LIMITS.max_string_bytes
    n = LIMITS.max_header_bytes // (size + 32) - 1
    kvs = [raw_kv(f"s.{i}", VT.STRING, chr(97 + i % 26) * size) for i in range(n)]
    path = write_raw(tmp_path / "m.gguf", _llama(*kvs))
    header, work = _work(path)
    _assert_bounded_work(header, work)
    header, peak = _peak(lambda: _parse_file(path))
    assert len(header.metadata) == n + 1
    assert peak < MAX_PEAK, peak


# Shard sets, one header at a time ------------------------------------------------------


def _shard(tmp_path: Path, *, no: int, count: int, total: int, names: range) -> Path:
    kvs = [
        raw_kv("split.no", VT.UINT16, no),
        raw_kv("split.count", VT.UINT16, count),
        raw_kv("split.tensors.count", VT.INT32, total),
    ]
    infos = [raw_tensor_info(f"t{i}", (8,), 0, 0) for i in names]
    # like gguf-split: only the first shard carries the model's metadata
    data = (
        _llama(*kvs, tensor_infos=infos, data_bytes=32)
        if no == 0
        else raw_gguf(kvs=kvs, tensor_infos=infos, data_bytes=32)
    )
    return write_raw(tmp_path / f"m-{no + 1:05d}-of-{count:05d}.gguf", data)


def test_inspect_files_merges_a_shard_set(tmp_path: Path) -> None:
    paths = [
        _shard(tmp_path, no=i, count=3, total=30, names=range(10 * i, 10 * i + 10))
        for i in range(3)
    ]
    facts = inspect_files(list(reversed(paths)))
    assert facts.architecture == "llama" and facts.split_count == 3
    assert sorted(facts.tensors) == sorted(f"t{i}" for i in range(30))
    assert facts.tensor_bytes == 30 * 32
    with pytest.raises(MissingShard, match="missing shard"):
        inspect_files(paths[:2])
    with pytest.raises(MissingShard, match="no GGUF files"):
        inspect_files([])


def test_inspect_files_caps_tensors_over_the_whole_set(tmp_path: Path) -> None:
    """Each shard is within the per-file cap, but the set is not: refused while reading,
    before every shard's tensors are held at once."""
    per = LIMITS.max_tensor_count // 2 + 1
    paths = [
        _shard(
            tmp_path,
            no=i,
            count=3,
            total=LIMITS.max_tensor_count,
            names=range(i * per, (i + 1) * per),
        )
        for i in range(3)
    ]
    with pytest.raises(InvalidGGUF, match="tensors together"):
        inspect_files(paths)


def test_inspect_files_refuses_a_tensor_in_two_shards(tmp_path: Path) -> None:
    paths = [_shard(tmp_path, no=i, count=2, total=2, names=range(1)) for i in range(2)]
    with pytest.raises(InvalidGGUF, match="more than one file"):
        inspect_files(paths)
