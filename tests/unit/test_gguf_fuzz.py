"""Fuzz tests: kama.gguf.reader.read_header must only ever return or raise InvalidGGUF.

Model files are untrusted input, so no mutation, truncation or random byte string may
escape as another exception type, hang, or make the parser allocate what the header claims.
The facts of whatever parses must either be refused (InvalidGGUF, MissingShard) or fit
the artifact's status: a ValidationError there would make the import retry forever.
"""

from __future__ import annotations

import functools
import io
import struct
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kama.gguf.artifact_status import gguf_info
from kama.gguf.header import GGUFHeader, InvalidGGUF
from kama.gguf.reader import read_header
from kama.gguf.shards import MissingShard, facts_from_header
from kamadev.gguf_factory import ModelShape, write_model

FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,  # keep runs from writing .hypothesis/ into the checkout
    suppress_health_check=[HealthCheck.too_slow],
)


@functools.cache
def _valid() -> tuple[bytes, int]:
    """A small valid model and the offset where its tensor data starts."""
    shape = ModelShape(n_layer=1, n_embd=32, n_head=2, n_head_kv=1, n_ff=32, vocab_extra=8)
    with tempfile.TemporaryDirectory() as tmp:
        data = write_model(Path(tmp) / "m.gguf", shape=shape).read_bytes()
    return data, read_header(io.BytesIO(data), file_size=len(data)).data_offset


def _parse_or_invalid(data: bytes, file_size: int | None = None) -> GGUFHeader | None:
    try:
        return read_header(
            io.BytesIO(data), file_size=len(data) if file_size is None else file_size
        )
    except InvalidGGUF:
        return None


@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=8
    ),
    cut=st.none() | st.integers(min_value=0),
)
def test_mutated_headers(edits: list[tuple[int, int]], cut: int | None) -> None:
    data, header_end = _valid()
    buf = bytearray(data)
    for pos, value in edits:
        buf[pos % header_end] = value
    if cut is not None:
        buf = buf[: cut % (len(buf) + 1)]
    _parse_or_invalid(bytes(buf))


@FUZZ
@given(
    pos=st.integers(min_value=0),
    value=st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]),
    width=st.sampled_from([1, 4, 8]),
)
def test_overwritten_fields(pos: int, value: int, width: int) -> None:
    """Overwrite a whole little-endian field with extreme values (counts, lengths, types)."""
    data, header_end = _valid()
    buf = bytearray(data)
    start = pos % (header_end - width)
    buf[start : start + width] = bytes([value]) * width
    _parse_or_invalid(bytes(buf))


@FUZZ
@given(
    pos=st.integers(min_value=0),
    value=st.sampled_from([0x00, 0x7F, 0x80, 0xFF]),
    width=st.sampled_from([1, 2, 4, 8]),
)
def test_facts_of_overwritten_fields_fit_a_status(pos: int, value: int, width: int) -> None:
    data, header_end = _valid()
    buf = bytearray(data)
    start = pos % (header_end - width)
    buf[start : start + width] = bytes([value]) * width
    header = _parse_or_invalid(bytes(buf))
    if header is None:
        return
    try:
        facts = facts_from_header(header)
    except (InvalidGGUF, MissingShard):
        return
    gguf_info(facts)


@FUZZ
@given(tail=st.binary(max_size=2048), version=st.sampled_from([2, 3]), lie=st.booleans())
def test_random_bytes_after_a_valid_preamble(tail: bytes, version: int, lie: bool) -> None:
    data = b"GGUF" + struct.pack("<I", version) + tail
    _parse_or_invalid(data, file_size=2**40 if lie else None)


@FUZZ
@given(data=st.binary(max_size=4096))
def test_fully_random_bytes(data: bytes) -> None:
    _parse_or_invalid(data)


def test_huge_string_claim_fails_without_allocating() -> None:
    key = struct.pack("<Q", 1) + b"k"
    for claim in (struct.pack("<Q", 2**60), key + struct.pack("<IQ", 8, 2**60)):
        data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + claim + b"\0" * 64
        for file_size in (len(data), 2**62):  # honest size, and a caller that trusts a lie
            tracemalloc.start()
            try:
                with pytest.raises(InvalidGGUF, match=f"claims {2**60} bytes"):
                    read_header(io.BytesIO(data), file_size=file_size)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < 1 << 20, f"peak {peak} bytes"
