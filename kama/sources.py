"""Which files of a source make up an artifact: exact names, or one shard pattern
expanded against the repository's listing and checked for completeness; and which of
them is the model llama-server serves (the entrypoint). Pure.

An artifact holds one model: one file or one complete shard set, possibly next to
other GGUF files such as a multimodal projector (``mmproj-*.gguf``). The entrypoint is
chosen here, when the source is resolved: ``spec.entrypoint`` when given, else the only
candidate model (a first shard, or a plain ``.gguf`` whose name does not say
``mmproj``). Two candidates are refused rather than guessed: the name that sorts first
is often the projector. The publish step reads the headers and checks the choice.

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
from kama.gguf.shards import MissingShard, parse_shard_name

MAX_FILES = 128
NAMES_SHOWN = 8  # file names a message lists before "and N more"


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
    """At most one shard set, complete; plain files (a projector) may sit next to it."""
    shards = [s for s in (parse_shard_name(n) for n in names) if s is not None]
    if not shards:
        return
    sets = {(s[0], s[2]) for s in shards}
    if len(sets) != 1:
        raise FileSelectionError(f"files: {len(sets)} different shard sets selected, expected one")
    ((stem, count),) = sets
    present = {s[1] for s in shards}
    missing = sorted(set(range(1, count + 1)) - present)
    if missing:
        raise MissingShard(
            f"shard set {stem}: missing shard(s) {', '.join(f'{n:05d}-of-{count:05d}' for n in missing)}",
            missing=tuple(missing),
        )


def names_shown(paths: list[str]) -> str:
    """`paths` for a message: the first few, then how many more."""
    more = len(paths) - NAMES_SHOWN
    return ", ".join(paths[:NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")


def looks_like_projector(path: str) -> bool:
    """Whether a file's name says it is a multimodal projector (``mmproj``), which is
    never the model llama-server is given. Only a hint: the publish step reads the
    header (``general.type``) to be sure."""
    return "mmproj" in PurePosixPath(path).name.lower()


def _candidates(files: list[SourceFile]) -> list[str]:
    """The files that could be the model: first shards and plain .gguf files that are
    not named as projectors."""
    found = []
    for f in files:
        shard = parse_shard_name(f.path)
        if shard is not None:
            if shard[1] == 1:
                found.append(f.path)
        elif f.path.endswith(".gguf") and not looks_like_projector(f.path):
            found.append(f.path)
    return found


def entrypoint(files: list[SourceFile], *, requested: str | None) -> str:
    """The file llama-server is pointed at: `requested` (``spec.entrypoint``, which must
    be one of `files` and, for a shard set, its first shard), else the only candidate
    model among `files`."""
    paths = [f.path for f in files]
    if not paths:
        raise FileSelectionError("files: no file selected, so no model file")
    shown = names_shown(paths)
    if requested is not None:
        if requested not in paths:
            raise FileSelectionError(f"spec.entrypoint {requested!r} is not one of {shown}")
        shard = parse_shard_name(requested)
        if shard is not None and shard[1] != 1:
            stem, _, count = shard
            first = str(PurePosixPath(requested).with_name(f"{stem}-00001-of-{count:05d}.gguf"))
            raise FileSelectionError(
                f"spec.entrypoint {requested!r} is shard {shard[1]} of {count}: "
                f"name the first shard, {first!r}"
            )
        if not requested.endswith(".gguf"):
            raise FileSelectionError(f"spec.entrypoint {requested!r} is not a .gguf file")
        return requested
    candidates = _candidates(files)
    if not candidates:
        raise FileSelectionError(
            f"files: no model file among {shown} (a .gguf file or the first shard of a "
            "set, not a projector named mmproj)"
        )
    if len(candidates) > 1:
        raise FileSelectionError(
            f"files: {len(candidates)} candidate model files ({names_shown(candidates)}): "
            "an artifact serves one model, set spec.entrypoint to the one llama-server serves"
        )
    return candidates[0]
