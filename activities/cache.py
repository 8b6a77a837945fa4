"""Activities on a cache volume (staging and free space, lookup, GGUF inspection,
publication, re-hashing), registered by the worker that runs next to the volume: the
importer."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import (
    DiscardRequest,
    DownloadedFile,
    LookupRequest,
    PublishedArtifact,
    PublishRequest,
    SpaceRequest,
    VerifyPublishedRequest,
)
from activities.storage import (
    ChecksumMismatch,
    InsufficientStorage,
    clean_stale_staging,
    ensure_free_space,
    publish,
    published,
    quarantine,
    staged_size,
    verify_files,
)
from kama.api import GGUFInfo
from kama.cache_layout import Manifest, ManifestFile, artifact_digest, blob_dir, staging_dir
from kama.gguf import InvalidGGUF, MissingShard, inspect_files

INSUFFICIENT_STORAGE = "InsufficientStorage"


@dataclass(frozen=True)
class StagingRequest:
    """Make room for an import whose partial files live in `staging_id`."""

    cache_root: str
    staging_id: str
    needed_bytes: int


def _no_room(exc: InsufficientStorage) -> ApplicationError:
    """The final error of an import that does not fit; its details carry the numbers
    (`freeBytes`, `neededBytes`) for the cache's InsufficientCapacity condition."""
    return ApplicationError(
        str(exc),
        {"freeBytes": exc.free_bytes, "neededBytes": exc.needed_bytes},
        type=INSUFFICIENT_STORAGE,
        non_retryable=True,
    )


def gguf_facts(directory: Path, files: list[DownloadedFile]) -> dict[str, Any]:
    """The artifact status's GGUF facts, one header in memory at a time."""
    paths = [directory / f.path for f in files if f.path.endswith(".gguf")]
    if not paths:
        raise InvalidGGUF("the artifact holds no .gguf file")
    facts = inspect_files(paths)
    return GGUFInfo.from_facts(facts).model_dump(mode="json", by_alias=True, exclude_none=True)


class CacheActivities:
    """Activities on a cache volume; registered by the worker next to the volume."""

    @activity.defn(name="Check free space in cache")
    def ensure_space(self, request: SpaceRequest) -> int:
        root = Path(request.cache_root)
        root.mkdir(parents=True, exist_ok=True)
        try:
            return ensure_free_space(root=root, needed_bytes=request.needed_bytes)
        except InsufficientStorage as exc:
            raise _no_room(exc) from None

    @activity.defn(name="Prepare cache staging")
    def prepare_staging(self, request: StagingRequest) -> int:
        """Remove abandoned staging directories, then check that the import fits: free
        bytes, counting its own partial files (a resumed import keeps them) as free."""
        root = Path(request.cache_root)
        root.mkdir(parents=True, exist_ok=True)
        removed = clean_stale_staging(root=root, keep=request.staging_id, now=time.time())
        if removed:
            activity.logger.info("removed stale staging %s", ", ".join(removed))
        try:
            return ensure_free_space(
                root=root,
                needed_bytes=request.needed_bytes,
                staged_bytes=staged_size(root=root, operation_id=request.staging_id),
            )
        except InsufficientStorage as exc:
            raise _no_room(exc) from None

    @activity.defn(name="Find published artifact")
    def lookup(self, request: LookupRequest) -> bool:
        return published(root=Path(request.cache_root), digest=request.manifest_digest) is not None

    @activity.defn(name="Inspect GGUF and publish artifact")
    def publish(self, request: PublishRequest) -> PublishedArtifact:
        root = Path(request.cache_root)
        entries = [ManifestFile(path=f.path, size=f.size, sha256=f.sha256) for f in request.files]
        manifest = Manifest.build(files=entries, entrypoint=request.entrypoint)
        if published(root=root, digest=manifest.digest) is not None:
            directory = root / blob_dir(manifest.digest)
        else:
            directory = root / staging_dir(request.operation_id) / "files"
        try:
            facts = gguf_facts(directory, request.files)
        except InvalidGGUF as exc:
            shutil.rmtree(root / staging_dir(request.operation_id), ignore_errors=True)
            raise ApplicationError(str(exc), type="InvalidGGUF", non_retryable=True) from None
        except MissingShard as exc:
            shutil.rmtree(root / staging_dir(request.operation_id), ignore_errors=True)
            raise ApplicationError(str(exc), type="MissingShard", non_retryable=True) from None
        final = publish(root=root, operation_id=request.operation_id, manifest=manifest)
        return PublishedArtifact(
            manifest_digest=manifest.digest,
            artifact_digest=artifact_digest(entries),
            total_size=manifest.total_size,
            directory=str(final),
            facts=facts,
        )

    @activity.defn(name="Re-hash published artifact")
    def verify_published(self, request: VerifyPublishedRequest) -> int:
        """Re-hash every file of a published blob against its manifest; returns bytes
        checked. A blob that fails is quarantined (`storage.quarantine`)."""
        root = Path(request.cache_root)
        manifest = published(root=root, digest=request.manifest_digest)
        if manifest is None:
            raise ApplicationError(
                f"no valid published artifact {request.manifest_digest} in the cache (manifest or READY missing)",
                type="ChecksumMismatch",
                non_retryable=True,
            )

        def beat(done: int) -> None:
            activity.heartbeat(done)

        try:
            verify_files(
                directory=root / blob_dir(request.manifest_digest),
                expected=list(manifest.files),
                on_progress=beat,
            )
        except ChecksumMismatch as exc:
            moved = quarantine(root=root, digest=request.manifest_digest)
            where = f"; the blob was moved to {moved.relative_to(root)}" if moved else ""
            raise ApplicationError(
                f"{exc}{where}: new replicas cannot mount it, and `retry` imports it again",
                type="ChecksumMismatch",
                non_retryable=True,
            ) from None
        return manifest.total_size

    @activity.defn(name="Discard staged files")
    def discard_staging(self, request: DiscardRequest) -> None:
        shutil.rmtree(
            Path(request.cache_root) / staging_dir(request.operation_id), ignore_errors=True
        )
