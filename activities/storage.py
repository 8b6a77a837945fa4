"""The cache volume as an external system: hashing, resumable downloads into
staging, and crash-safe publication into the content-addressed layout.

These functions run next to the volume (in the importer pod). They are idempotent:
a download resumes from the partial file it finds (re-hashing the local prefix, never
fetching it again), and publishing an artifact whose digest is already published
is a no-op that reuses the existing blob.

A partial file is resumed only if it was started from the same origin: next to it, a
hidden marker (`.<name>.origin`) names what its bytes came from (a commit-pinned URL,
or a source file's inode, size and times). A partial from anything else (a branch
that moved, a source file rewritten since) is emptied and fetched again, never
completed with bytes of another file. The markers are removed before publication.
Staging directories that no import has touched for `STALE_STAGING_AFTER` are
abandoned (their artifact was deleted, or its import gave up long ago) and removed
before a new import measures free space.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx

from activities.hashed_writer import HashedWriter
from kama.cache_layout import (
    MANIFEST_NAME,
    READY_NAME,
    STAGING_DIR,
    Manifest,
    ManifestFile,
    blob_dir,
    safe_relative_path,
    staging_dir,
)

CHUNK_BYTES = 1 << 20
ORIGIN_SUFFIX = ".origin"
STALE_STAGING_AFTER = timedelta(hours=24)
QUARANTINE_PREFIX = "quarantine-"
Progress = Callable[[int], None]


class SourceUnavailable(Exception):
    """The source refused the request (401/403/404): retrying will not help."""


class TransferInterrupted(Exception):
    """The connection ended early or the server failed (5xx): retry resumes."""


class ChecksumMismatch(Exception):
    """The bytes do not have the sha256 the source or the spec promised."""


class InsufficientStorage(Exception):
    """The cache volume has less free space than the import needs."""

    def __init__(self, *, free_bytes: int, needed_bytes: int) -> None:
        super().__init__(f"cache has {free_bytes} bytes free, the import needs {needed_bytes}")
        self.free_bytes = free_bytes
        self.needed_bytes = needed_bytes


def _noop(_: int) -> None:
    return None


def hash_file(path: Path, *, on_progress: Progress = _noop, chunk_bytes: int = CHUNK_BYTES) -> str:
    """sha256 of a file in one sequential pass; `on_progress` gets bytes done."""
    digest = hashlib.sha256()
    done = 0
    with path.open("rb", buffering=0) as f:
        buffer = bytearray(chunk_bytes)
        view = memoryview(buffer)
        while n := f.readinto(buffer):
            digest.update(view[:n])
            done += n
            on_progress(done)
    return digest.hexdigest()


def ensure_free_space(*, root: Path, needed_bytes: int, staged_bytes: int = 0) -> int:
    """Free bytes of the volume, counting `staged_bytes` (this import's own partial
    files, which it keeps) as free; InsufficientStorage when that is below
    `needed_bytes`."""
    free = shutil.disk_usage(root).free + staged_bytes
    if free < needed_bytes:
        raise InsufficientStorage(free_bytes=free, needed_bytes=needed_bytes)
    return free


def _last_change(directory: Path) -> float:
    """The newest modification time of `directory` and anything under it."""
    newest = directory.lstat().st_mtime
    for parent, dirs, files in os.walk(directory):
        for name in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):
                newest = max(newest, os.lstat(os.path.join(parent, name)).st_mtime)
    return newest


def clean_stale_staging(
    *, root: Path, keep: str, now: float, stale_after: timedelta = STALE_STAGING_AFTER
) -> list[str]:
    """Remove the staging directories (other than `keep`) in which nothing changed for
    `stale_after`: partial downloads no import will resume. The names removed."""
    staging = root / STAGING_DIR
    if not staging.is_dir():
        return []
    removed = []
    for entry in sorted(staging.iterdir()):
        if entry.name == keep or not entry.is_dir() or entry.is_symlink():
            continue
        if _last_change(entry) < now - stale_after.total_seconds():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


def staged_size(*, root: Path, operation_id: str) -> int:
    """Bytes already staged by the import `operation_id` (its partial files)."""
    files = root / staging_dir(operation_id) / "files"
    if not files.is_dir():
        return 0
    return sum(
        p.stat().st_size
        for p in files.rglob("*")
        if p.is_file() and not p.name.endswith(ORIGIN_SUFFIX)
    )


def origin_marker(target: Path) -> Path:
    """The hidden file next to a partial file that names where its bytes came from."""
    return target.with_name(f".{target.name}{ORIGIN_SUFFIX}")


def resume_partial(*, target: Path, origin: str, size: int) -> tuple[int, hashlib._Hash]:
    """How many bytes of `target` a transfer of `size` bytes from `origin` keeps, and
    the sha256 of those bytes so far. A partial file from another origin (or longer
    than `size`) is emptied first, and the marker names `origin` before any byte of
    it is written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    marker = origin_marker(target)
    digest = hashlib.sha256()
    try:
        recorded: str | None = marker.read_text()
    except FileNotFoundError:
        recorded = None
    offset = target.stat().st_size if target.exists() else 0
    if recorded != origin or offset > size:
        target.unlink(missing_ok=True)
        _fsync_dir(target.parent)
        marker.write_text(origin)
        with marker.open("rb") as fh:
            os.fsync(fh.fileno())
        return 0, digest
    if not offset:
        return 0, digest
    with target.open("rb") as f:
        while block := f.read(CHUNK_BYTES):
            digest.update(block)
    return offset, digest


@dataclass(frozen=True)
class Download:
    url: str
    headers: dict[str, str]
    size: int


def download_resumable(
    *,
    client: httpx.Client,
    source: Download,
    target: Path,
    on_progress: Progress = _noop,
) -> str:
    """Download into `target`, resuming after the bytes it already holds from the same
    URL, and return the sha256 of the whole file, computed while the bytes arrive."""
    offset, digest = resume_partial(
        target=target, origin=f"{source.url.split('?')[0]} {source.size}", size=source.size
    )
    on_progress(offset)
    if offset < source.size:
        headers = dict(source.headers)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        try:
            with client.stream("GET", source.url, headers=headers) as response:
                if response.status_code in (401, 403, 404):
                    raise SourceUnavailable(
                        f"source answered HTTP {response.status_code} for {source.url.split('?')[0]}"
                    )
                if response.status_code >= 400:
                    raise TransferInterrupted(f"source answered HTTP {response.status_code}")
                if offset and response.status_code != 206:
                    raise TransferInterrupted("source ignored the Range request")
                # written and hashed in another thread as the socket's reads arrive
                # (never gathered first: a slow source's bytes reach the disk as
                # they come); what was received before a break is still written
                with HashedWriter(target=target, digest=digest, offset=offset) as out:
                    for block in response.iter_raw():
                        out.write(block)
                        on_progress(out.written)
                    out.finish()  # every byte on disk, fsynced, in the digest
                    offset = out.written
                    on_progress(offset)
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise TransferInterrupted(
                f"transfer interrupted at byte {max(offset, target.stat().st_size)}: "
                f"{type(exc).__name__}"
            ) from exc
    if offset != source.size:
        raise TransferInterrupted(f"got {offset} of {source.size} bytes")
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def published(*, root: Path, digest: str) -> Manifest | None:
    """The manifest of a published artifact, or None unless manifest + READY are valid."""
    directory = root / blob_dir(digest)
    try:
        data = (directory / MANIFEST_NAME).read_bytes()
        if not (directory / READY_NAME).is_file():
            return None
        manifest = Manifest.parse(data)
    except (OSError, ValueError):
        return None
    if manifest.digest != digest:
        return None
    for f in manifest.files:
        path = directory / f.path
        if not path.is_file() or path.stat().st_size != f.size:
            return None
    return manifest


def publish(*, root: Path, operation_id: str, manifest: Manifest) -> Path:
    """Move verified files from staging into blobs/sha256/<digest>; READY last.

    Files must already be under `<staging>/files/<path>` with their sha256 checked.
    """
    digest = manifest.digest
    final = root / blob_dir(digest)
    if published(root=root, digest=digest) is not None:
        shutil.rmtree(root / staging_dir(operation_id), ignore_errors=True)
        return final
    staged = root / staging_dir(operation_id) / "files"
    if not final.exists():
        for f in manifest.files:
            path = staged / safe_relative_path(f.path)
            origin_marker(path).unlink(missing_ok=True)
            if path.stat().st_size != f.size:
                raise ChecksumMismatch(f"{f.path}: staged size {path.stat().st_size} != {f.size}")
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
        manifest_path = staged / MANIFEST_NAME
        manifest_path.write_bytes(manifest.canonical_json())
        with manifest_path.open("rb") as fh:
            os.fsync(fh.fileno())
        _fsync_dir(staged)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, final)
        _fsync_dir(final.parent)
    else:
        # a previous attempt renamed but died before READY: check before completing it
        on_disk = Manifest.parse((final / MANIFEST_NAME).read_bytes())
        if on_disk != manifest:
            raise ChecksumMismatch(f"{final} holds a different manifest")
    ready = final / READY_NAME
    tmp = final / f".{READY_NAME}.tmp"
    tmp.write_text(digest + "\n")
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    os.rename(tmp, ready)
    _fsync_dir(final)
    shutil.rmtree(root / staging_dir(operation_id), ignore_errors=True)
    return final


def quarantine(*, root: Path, digest: str) -> Path | None:
    """Move a published blob whose bytes no longer match its manifest out of the
    published tree, into staging (never served, removed once stale), so that no new
    replica mounts it and the next import downloads it again instead of reusing it.
    Replicas that already run keep their open files. Where it went, or None."""
    found = root / blob_dir(digest)
    if not found.is_dir():
        return None
    target = root / staging_dir(f"{QUARANTINE_PREFIX}{digest}")
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(found, target)
    _fsync_dir(found.parent)
    return target


def staged_file(*, root: Path, operation_id: str, path: str) -> Path:
    return root / staging_dir(operation_id) / "files" / safe_relative_path(path)


def verify_files(
    *, directory: Path, expected: list[ManifestFile], on_progress: Progress = _noop
) -> None:
    """Re-hash files in place (PVC Direct sources, or verify of a published blob)."""
    done = 0
    for f in expected:
        base = done

        def file_progress(n: int, base: int = base) -> None:
            on_progress(base + n)

        actual = hash_file(directory / f.path, on_progress=file_progress)
        if actual != f.sha256:
            raise ChecksumMismatch(f"{f.path}: sha256 {actual} != expected {f.sha256}")
        done += f.size
