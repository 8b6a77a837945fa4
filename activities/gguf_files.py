"""GGUF files on a volume, opened for the pure reader (``kama.gguf``).

``kama.gguf`` parses a header from any byte stream and never opens a file; this is
the one place that does: each function opens a model's file, hands the open stream
and its size to the reader, and closes it before the next, so a shard set is read one
header at a time. The cache activities (the import's inspection) and the tests call
these.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from kama.gguf.facts import GGUFFacts
from kama.gguf.header import DEFAULT_LIMITS, GGUFHeader, HeaderLimits
from kama.gguf.reader import read_header
from kama.gguf.shards import facts_from_header, facts_from_headers

__all__ = ["inspect_file", "inspect_files", "read_file_header"]


def read_file_header(path: Path, *, limits: HeaderLimits = DEFAULT_LIMITS) -> GGUFHeader:
    """The header of the GGUF file at ``path``, read and checked; the rest of the file
    is never read. Raises InvalidGGUF, or OSError when the file cannot be read."""
    with path.open("rb") as f:
        return read_header(f, file_size=os.fstat(f.fileno()).st_size, limits=limits)


def inspect_files(paths: Sequence[Path], *, limits: HeaderLimits = DEFAULT_LIMITS) -> GGUFFacts:
    """Facts of one model given as its GGUF files: one file, or a complete shard set in
    any order, one header in memory at a time (``kama.gguf.shards.facts_from_headers``).

    Raises InvalidGGUF or MissingShard (also for a lone shard of a larger set).
    """
    headers = (read_file_header(path, limits=limits) for path in paths)
    return facts_from_headers(headers, max_tensors=limits.max_tensor_count)


def inspect_file(path: Path) -> GGUFFacts:
    """Read only the header of the GGUF file at ``path`` and summarize it as a whole
    model (a lone shard of a larger set is MissingShard)."""
    return facts_from_header(read_file_header(path))
