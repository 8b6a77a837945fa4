"""Activities on a cache volume (free space, lookup, GGUF inspection, publication),
registered by the worker that runs next to the volume: the importer."""

from __future__ import annotations

import shutil
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
    ensure_free_space,
    publish,
    published,
    verify_files,
)
from kama.api import GGUFInfo
from kama.cache_layout import Manifest, ManifestFile, artifact_digest, blob_dir, staging_dir
from kama.gguf import InvalidGGUF, MissingShard, inspect_files


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
            raise ApplicationError(
                str(exc), type="InsufficientStorage", non_retryable=True
            ) from None

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
        """Re-hash every file of a published blob against its manifest; returns bytes checked."""
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
            raise ApplicationError(str(exc), type="ChecksumMismatch", non_retryable=True) from None
        return manifest.total_size

    @activity.defn(name="Discard staged files")
    def discard_staging(self, request: DiscardRequest) -> None:
        shutil.rmtree(
            Path(request.cache_root) / staging_dir(request.operation_id), ignore_errors=True
        )
