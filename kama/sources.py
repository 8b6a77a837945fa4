"""Which files of a source make up an artifact: exact names, or one shard pattern
expanded against the repository's listing and checked for completeness. Pure.

The names come from the source (a Hub listing, a directory on a claim) and become
paths in the cache, so each chosen name is checked here, when the source is resolved:
it must be a plain relative path (no ``..``, absolute path, backslash or empty part)
and must not be a name Kama writes into the blob itself (``manifest.json``, ``READY``).
Refused here, the import fails at once with a message naming the file; found later, a
download would retry forever or a publish would overwrite the model's own file.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import PurePosixPath

from kama.cache_layout import RESERVED_NAMES, InvalidPath, safe_relative_path
from kama.gguf import MissingShard, parse_shard_name

MAX_FILES = 128


class FileSelectionError(ValueError):
    """The requested files do not exist in the source or do not form an artifact."""


@dataclass(frozen=True)
class SourceFile:
    path: str
    size: int
    sha256: str | None  # the source's own claim (Hub LFS sha256), checked after download


def _is_pattern(name: str) -> bool:
    return any(ch in name for ch in "*?[")


def select_files(*, requested: list[str], available: list[SourceFile]) -> list[SourceFile]:
    """Resolve `requested` (names or one glob) against `available`, sorted by path.

    A glob must match exactly one complete shard set (`-0000i-of-0000N.gguf`);
    a shard set given by names must be complete too.
    """
    by_path = {f.path: f for f in available}
    patterns = [r for r in requested if _is_pattern(r)]
    if len(patterns) > 1 or (patterns and len(requested) > 1):
        raise FileSelectionError("files: give file names or exactly one shard pattern, not both")
    if patterns:
        names = sorted(p for p in by_path if fnmatch.fnmatchcase(p, patterns[0]))
        if not names:
            raise FileSelectionError(
                f"files: pattern {patterns[0]!r} matches nothing in the source"
            )
    else:
        missing = [r for r in requested if r not in by_path]
        if missing:
            raise FileSelectionError(f"files: {', '.join(missing)} not found in the source")
        names = sorted(set(requested))
    if len(names) > MAX_FILES:
        raise FileSelectionError(f"files: {len(names)} files selected, at most {MAX_FILES} allowed")
    for name in names:
        _check_name(name)
    _check_shards(names)
    return [by_path[n] for n in names]


def _check_name(name: str) -> None:
    """Refuse a name that could leave the artifact's directory or collide with Kama's own
    files. The base name is what counts: a claim's files are copied in under it."""
    try:
        safe_relative_path(name)
    except InvalidPath as exc:
        raise FileSelectionError(f"files: the source's file {name!r} is refused: {exc}") from None
    if PurePosixPath(name).name in RESERVED_NAMES:
        raise FileSelectionError(
            f"files: the source's file {name!r} is refused: Kama writes a file of that name "
            f"next to the model ({', '.join(sorted(RESERVED_NAMES))} are reserved)"
        )


def _check_shards(names: list[str]) -> None:
    shards = [parse_shard_name(n) for n in names]
    if not any(shards):
        return
    if not all(shards):
        raise FileSelectionError(
            "files: shard files and plain files cannot be mixed in one artifact"
        )
    sets = {(s[0], s[2]) for s in shards if s}
    if len(sets) != 1:
        raise FileSelectionError(f"files: {len(sets)} different shard sets selected, expected one")
    ((stem, count),) = sets
    present = {s[1] for s in shards if s}
    missing = sorted(set(range(1, count + 1)) - present)
    if missing:
        raise MissingShard(
            f"shard set {stem}: missing shard(s) {', '.join(f'{n:05d}-of-{count:05d}' for n in missing)}",
            missing=tuple(missing),
        )


def entrypoint(files: list[SourceFile]) -> str:
    """The file llama-server is pointed at: the only file or the first shard."""
    for f in files:
        parsed = parse_shard_name(f.path)
        if parsed is not None and parsed[1] == 1:
            return f.path
    gguf = [f.path for f in files if f.path.endswith(".gguf")]
    return gguf[0] if gguf else files[0].path
