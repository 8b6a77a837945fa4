"""Appending downloaded bytes to a staging file and hashing them, off the thread that
reads the network, so a download costs about the slower of the two instead of their
sum (on the importer's cores, reading the socket and sha256 otherwise take turns).

`HashedWriter` takes blocks as they arrive, in order, into a queue of at most
`MAX_QUEUED_BLOCKS` (so memory stays bounded by a few blocks whatever the link
speed); one thread writes each block and feeds it to sha256 (both release the GIL
for blocks this size). `finish` waits for every queued block to be on disk and
fsynced and returns the digest; `close` (also on an error of the reader) still
writes what was queued, so a resumed transfer never fetches those bytes again.
Progress is read from `written` by the caller's thread (Temporal's heartbeat belongs
to the activity's thread).

Every `WRITEBACK_BYTES` written, the writer starts the disk write-back of that range
(`posix_fadvise(POSIX_FADV_DONTNEED)`: Linux writes the dirty range back without
waiting for it, and drops it from the page cache once clean; the importer never reads
these bytes again), so the fsync at the end waits for the last few MiB rather than
for the whole file: a download costs about the slower of the network and the disk,
not the network and then the disk."""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from pathlib import Path
from types import TracebackType

MAX_QUEUED_BLOCKS = 16
WRITEBACK_BYTES = 32 << 20


class HashedWriter:
    """Appends to `target` (`offset` bytes long), updating `digest` (the sha256 of
    those bytes)."""

    def __init__(self, *, target: Path, digest: hashlib._Hash, offset: int) -> None:
        self._out = target.open("ab")
        self._digest = digest
        self._written = offset
        self._blocks: queue.Queue[bytes | None] = queue.Queue(maxsize=MAX_QUEUED_BLOCKS)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hashed-writer", daemon=True)
        self._thread.start()

    @property
    def written(self) -> int:
        """Bytes in the file so far (only what the writer thread has written)."""
        return self._written

    def write(self, block: bytes) -> None:
        """Queue `block`, waiting while the queue is full; raises what the writer
        thread failed with, if it did."""
        if self._error is not None:
            raise self._error
        if block:
            self._blocks.put(block)

    def finish(self) -> None:
        """Every block on disk, fsynced, and in the digest."""
        self.close()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Write what is queued, then close the file (idempotent)."""
        if self._thread.is_alive():
            self._blocks.put(None)
            self._thread.join()
        if not self._out.closed:
            self._out.close()

    def __enter__(self) -> HashedWriter:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self) -> None:
        out, digest = self._out, self._digest
        written_back = self._written
        try:
            while (block := self._blocks.get()) is not None:
                out.write(block)
                digest.update(block)
                self._written += len(block)
                if self._written - written_back >= WRITEBACK_BYTES:
                    out.flush()
                    _start_writeback(out.fileno(), start=written_back, end=self._written)
                    written_back = self._written
            out.flush()
            os.fsync(out.fileno())
        except BaseException as exc:  # handed to the reader's next write or finish
            self._error = exc
            while self._blocks.get() is not None:  # let a blocked write() return
                pass


def _start_writeback(fd: int, *, start: int, end: int) -> None:
    if hasattr(os, "posix_fadvise"):  # Linux; elsewhere the final fsync does it all
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
