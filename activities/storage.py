"""The cache volume as an external system: hashing, resumable downloads into
staging, and crash-safe publication into the content-addressed layout.

These functions run next to the volume (in the importer pod). They are idempotent:
a download resumes from the partial file it finds (re-hashing the local prefix, never
fetching it again), and publishing an artifact whose digest is already published
is a no-op that reuses the existing blob.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from kama.cache_layout import (
    MANIFEST_NAME,
    READY_NAME,
    Manifest,
    ManifestFile,
    blob_dir,
    safe_relative_path,
    staging_dir,
)

CHUNK_BYTES = 1 << 20
Progress = Callable[[int], None]


class SourceUnavailable(Exception):
    """The source refused the request (401/403/404): retrying will not help."""


class TransferInterrupted(Exception):
    """The connection ended early or the server failed (5xx): retry resumes."""


class ChecksumMismatch(Exception):
    """The bytes do not have the sha256 the source or the spec promised."""


class InsufficientStorage(Exception):
    """The cache volume has less free space than the import needs."""


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


def ensure_free_space(*, root: Path, needed_bytes: int) -> int:
    free = shutil.disk_usage(root).free
    if free < needed_bytes:
        raise InsufficientStorage(f"cache has {free} bytes free, the import needs {needed_bytes}")
    return free


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
    """Download into `target`, resuming after whatever bytes it already holds, and
    return the sha256 of the whole file, computed while the bytes arrive."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    offset = 0
    if target.exists():
        offset = target.stat().st_size
        if offset > source.size:
            target.unlink()
            offset = 0
        else:
            with target.open("rb") as f:
                while block := f.read(CHUNK_BYTES):
                    digest.update(block)
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
                with target.open("ab") as out:
                    for block in (
                        response.iter_raw()
                    ):  # as bytes arrive: nothing buffered is lost on a break
                        out.write(block)
                        digest.update(block)
                        offset += len(block)
                        on_progress(offset)
                    out.flush()
                    os.fsync(out.fileno())
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise TransferInterrupted(
                f"transfer interrupted at byte {offset}: {type(exc).__name__}"
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
