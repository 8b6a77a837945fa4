"""The content-addressed layout of a model cache, and the manifest that names an
artifact. Pure: paths and digests only, no file access.

```
.kama/staging/<operation-id>/...           partial downloads, never served
blobs/sha256/<manifest-digest>/manifest.json
blobs/sha256/<manifest-digest>/<relative files>
blobs/sha256/<manifest-digest>/READY       written last, after fsync + atomic rename
```
A manifest lists every file's relative path, size and sha256 (sorted by path) and
the entrypoint (the file llama-server is given: the single file or the first shard).
Its canonical JSON's sha256 is the publication key, so two artifacts with the same
bytes share one directory, and a directory is an artifact only with a valid
manifest and READY.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

STAGING_DIR = ".kama/staging"
BLOBS_DIR = "blobs/sha256"
MANIFEST_NAME = "manifest.json"
READY_NAME = "READY"
READY_TMP_NAME = f".{READY_NAME}.tmp"  # READY is written here first, then renamed
# Names Kama writes into a blob directory itself, so an artifact's own files may not
# take them (a source's file by one of these names would be overwritten on publish).
RESERVED_NAMES = frozenset({MANIFEST_NAME, READY_NAME, READY_TMP_NAME})
MANIFEST_SCHEMA = "kama.dev/manifest/v1"

_SHA256 = re.compile(r"[0-9a-f]{64}")
_OPERATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class InvalidPath(ValueError):
    """A relative path that could escape its root or is not a plain file name."""


def safe_relative_path(path: str) -> PurePosixPath:
    """Validate a relative path inside an artifact or a source claim."""
    if not path or "\\" in path or "\0" in path:
        raise InvalidPath(f"path {path!r} is empty or contains a backslash or NUL")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        raise InvalidPath(f"path {path!r} must be relative")
    if any(part in ("..", ".", "") for part in path.split("/")):
        raise InvalidPath(f"path {path!r} must not contain '.', '..' or empty segments")
    return pure


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    sha256: str

    def __post_init__(self) -> None:
        safe_relative_path(self.path)
        if self.size < 0:
            raise ValueError(f"{self.path}: negative size")
        if not _SHA256.fullmatch(self.sha256):
            raise ValueError(f"{self.path}: sha256 must be 64 lowercase hex characters")


@dataclass(frozen=True)
class Manifest:
    files: tuple[ManifestFile, ...]
    entrypoint: str

    def __post_init__(self) -> None:
        paths = [f.path for f in self.files]
        if not paths:
            raise ValueError("a manifest lists at least one file")
        if paths != sorted(paths) or len(set(paths)) != len(paths):
            raise ValueError("manifest files must be sorted by path and unique")
        if self.entrypoint not in paths:
            raise ValueError(f"entrypoint {self.entrypoint!r} is not one of the files")

    @classmethod
    def build(cls, *, files: list[ManifestFile], entrypoint: str) -> Manifest:
        return cls(files=tuple(sorted(files, key=lambda f: f.path)), entrypoint=entrypoint)

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def canonical_json(self) -> bytes:
        body = {
            "schema": MANIFEST_SCHEMA,
            "entrypoint": self.entrypoint,
            "files": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in self.files],
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical_json()).hexdigest()

    @classmethod
    def parse(cls, data: bytes) -> Manifest:
        try:
            body = json.loads(data)
            if body.get("schema") != MANIFEST_SCHEMA:
                raise ValueError(f"unknown manifest schema {body.get('schema')!r}")
            files = [
                ManifestFile(path=f["path"], size=int(f["size"]), sha256=f["sha256"])
                for f in body["files"]
            ]
            manifest = cls(files=tuple(files), entrypoint=body["entrypoint"])
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"malformed manifest: {exc}") from exc
        if manifest.canonical_json() != data:
            raise ValueError("manifest is not in canonical form")
        return manifest


def artifact_digest(files: list[ManifestFile]) -> str:
    """Digest of the bytes alone (no names): for a single file, its sha256."""
    if len(files) == 1:
        return files[0].sha256
    joined = "".join(f.sha256 for f in sorted(files, key=lambda f: f.path))
    return hashlib.sha256(joined.encode()).hexdigest()


def expected_digest_mismatch(*, expected: str | None, files: Sequence[ManifestFile]) -> str | None:
    """Why `files` are not the artifact `spec.expectedSHA256` names, or None (they are,
    or nothing is expected). The digest compared is the artifact digest: the file's
    sha256 for a single file, `artifact_digest` of the set for a shard set."""
    if not expected or not files:
        return None
    actual = artifact_digest(list(files))
    if actual == expected:
        return None
    what = (
        f"{files[0].path}: sha256" if len(files) == 1 else f"artifact digest of {len(files)} files"
    )
    return f"{what} {actual} != spec.expectedSHA256 {expected}"


def blob_dir(digest: str) -> PurePosixPath:
    if not _SHA256.fullmatch(digest):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return PurePosixPath(BLOBS_DIR) / digest


def staging_dir(operation_id: str) -> PurePosixPath:
    if not _OPERATION_ID.fullmatch(operation_id):
        raise ValueError(
            f"operation id {operation_id!r} must be [A-Za-z0-9._-], at most 128 characters"
        )
    return PurePosixPath(STAGING_DIR) / operation_id
