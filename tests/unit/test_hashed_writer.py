"""The staging writer that hashes off the network thread: the file and the digest are
exactly the bytes given, in order; what was queued before the reader failed still
reaches the file (a resume never refetches it); a disk error reaches the reader; it
never holds more than a few blocks."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from activities import hashed_writer
from activities.hashed_writer import HashedWriter


def test_file_and_digest_are_the_blocks_in_order(tmp_path: Path) -> None:
    target = tmp_path / "part"
    target.write_bytes(b"prefix")
    digest = hashlib.sha256(b"prefix")
    blocks = [os.urandom(n) for n in (1, 70_000, 1 << 20, 3)]
    with HashedWriter(target=target, digest=digest, offset=6) as out:
        for block in blocks:
            out.write(block)
        out.finish()
        assert out.written == 6 + sum(map(len, blocks))
    whole = b"prefix" + b"".join(blocks)
    assert target.read_bytes() == whole
    assert digest.hexdigest() == hashlib.sha256(whole).hexdigest()


def test_blocks_queued_before_a_break_are_written(tmp_path: Path) -> None:
    target = tmp_path / "part"
    target.touch()
    with (
        pytest.raises(ConnectionError),
        HashedWriter(target=target, digest=hashlib.sha256(), offset=0) as out,
    ):
        for _ in range(5):
            out.write(b"x" * 1000)
        raise ConnectionError("the source went away")
    assert target.read_bytes() == b"x" * 5000


def test_a_write_error_reaches_the_reader(tmp_path: Path) -> None:
    target = tmp_path / "part"
    target.touch()
    out = HashedWriter(target=target, digest=hashlib.sha256(), offset=0)
    out._out.close()  # the volume went away under the writer
    with pytest.raises(ValueError):
        for _ in range(hashed_writer.MAX_QUEUED_BLOCKS * 4):  # never blocks for good
            out.write(b"y" * 10)
        out.finish()
    out.close()


def test_the_queue_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "part"
    target.touch()
    gate = threading.Event()
    digest = hashlib.sha256()
    real_update = digest.update

    class SlowDigest:
        def update(self, data: bytes) -> None:
            gate.wait()
            real_update(data)

        def hexdigest(self) -> str:
            return digest.hexdigest()

    out = HashedWriter(target=target, digest=SlowDigest(), offset=0)  # type: ignore[arg-type]
    done = threading.Event()

    def produce() -> None:
        for _ in range(hashed_writer.MAX_QUEUED_BLOCKS * 3):
            out.write(b"z")
        done.set()

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    assert not done.wait(0.5), "the reader ran ahead of a stalled writer without bound"
    gate.set()
    assert done.wait(10)
    out.finish()
    assert target.read_bytes() == b"z" * (hashed_writer.MAX_QUEUED_BLOCKS * 3)
