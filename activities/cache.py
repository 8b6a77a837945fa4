"""Activities on a cache volume (staging and free space, lookup, GGUF inspection,
publication, re-hashing), registered by the worker that runs next to the volume: the
importer.

The GGUF inspection also checks what the artifact's files are: the entrypoint (chosen
from the names when the source was resolved) must be a model, not a multimodal
projector, and every other GGUF file is either part of its shard set or the one
projector that goes with it. A second model is refused: an artifact holds one model,
and the facts the planner sizes replicas with are the entrypoint's alone.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.gguf_files import inspect_files, read_file_header
from activities.import_payloads import (
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
from kama.cache_layout import Manifest, ManifestFile, artifact_digest, blob_dir, staging_dir
from kama.gguf.artifact_status import gguf_info
from kama.gguf.header import InvalidGGUF
from kama.gguf.shards import MissingShard, parse_shard_name
from kama.reasons import Failure
from kama.sources import names_shown

PROJECTOR_TYPE = "mmproj"  # general.type of a multimodal projector (llama.cpp's mtmd)
PROJECTOR_ARCHITECTURE = "clip"  # general.architecture of one (older converters)


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
        type=Failure.INSUFFICIENT_STORAGE,
        non_retryable=True,
    )


def gguf_facts(directory: Path, files: list[DownloadedFile]) -> dict[str, Any]:
    """GGUF facts of `files` taken as one model (one file or a complete shard set), one
    header in memory at a time, in the shape of the artifact status's ``gguf``."""
    paths = [directory / f.path for f in files if f.path.endswith(".gguf")]
    if not paths:
        raise InvalidGGUF("the artifact holds no .gguf file")
    facts = inspect_files(paths)
    return gguf_info(facts).model_dump(mode="json", by_alias=True, exclude_none=True)


@dataclass(frozen=True)
class ArtifactGGUF:
    """What an artifact's GGUF files are: the model's facts and its projector, if any."""

    facts: dict[str, Any]
    projector: str | None


def _projector_kind(path: Path) -> str | None:
    """Why the GGUF file at `path` is a multimodal projector (the metadata that says
    so), or None when it is not one. Reads and checks the header only."""
    metadata = read_file_header(path).metadata
    if metadata.get("general.type") == PROJECTOR_TYPE:
        return f"general.type {PROJECTOR_TYPE}"
    if metadata.get("general.architecture") == PROJECTOR_ARCHITECTURE:
        return f"general.architecture {PROJECTOR_ARCHITECTURE}"
    return None


def _model_files(*, entrypoint: str, paths: list[str]) -> list[str]:
    """The entrypoint and, when it is a first shard, the rest of its set."""
    shard = parse_shard_name(entrypoint)
    if shard is None:
        return [entrypoint]
    parent = PurePosixPath(entrypoint).parent
    return [
        p
        for p in paths
        if PurePosixPath(p).parent == parent
        and (s := parse_shard_name(p)) is not None
        and (s[0], s[2]) == (shard[0], shard[2])
    ]


def inspect_artifact(
    *, directory: Path, files: list[DownloadedFile], entrypoint: str
) -> ArtifactGGUF:
    """Check that `entrypoint` is a model and every other GGUF file of the artifact is
    part of its shard set or its one projector; the facts are the model's. Raises
    InvalidGGUF (for a file that is not what it should be) or MissingShard."""
    paths = sorted(f.path for f in files if f.path.endswith(".gguf"))
    if entrypoint not in paths:
        raise InvalidGGUF(f"the entrypoint {entrypoint} is not a .gguf file of the artifact")
    model = _model_files(entrypoint=entrypoint, paths=paths)
    kind = _projector_kind(directory / entrypoint)
    if kind is not None:
        raise InvalidGGUF(
            f"{entrypoint} is a multimodal projector ({kind}), not a model: "
            "set spec.entrypoint to the model file"
        )
    projectors = []
    for path in paths:
        if path in model:
            continue
        if _projector_kind(directory / path) is None:
            raise InvalidGGUF(
                f"{path} is a second model next to {entrypoint}: an artifact holds one "
                "model (and at most one multimodal projector); select one model's files"
            )
        projectors.append(path)
    if len(projectors) > 1:
        raise InvalidGGUF(
            f"{len(projectors)} multimodal projectors ({names_shown(projectors)}): "
            "an artifact holds at most one; select the one that goes with the model"
        )
    facts = gguf_facts(directory, [f for f in files if f.path in model])
    return ArtifactGGUF(facts=facts, projector=projectors[0] if projectors else None)


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
            found = inspect_artifact(
                directory=directory, files=request.files, entrypoint=request.entrypoint
            )
        except InvalidGGUF as exc:
            shutil.rmtree(root / staging_dir(request.operation_id), ignore_errors=True)
            raise ApplicationError(
                str(exc), type=Failure.INVALID_GGUF, non_retryable=True
            ) from None
        except MissingShard as exc:
            shutil.rmtree(root / staging_dir(request.operation_id), ignore_errors=True)
            raise ApplicationError(
                str(exc), type=Failure.MISSING_SHARD, non_retryable=True
            ) from None
        final = publish(root=root, operation_id=request.operation_id, manifest=manifest)
        return PublishedArtifact(
            manifest_digest=manifest.digest,
            artifact_digest=artifact_digest(entries),
            total_size=manifest.total_size,
            directory=str(final),
            facts=found.facts,
            entrypoint=request.entrypoint,
            projector=found.projector,
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
                type=Failure.CHECKSUM_MISMATCH,
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
                type=Failure.CHECKSUM_MISMATCH,
                non_retryable=True,
            ) from None
        return manifest.total_size

    @activity.defn(name="Discard staged files")
    def discard_staging(self, request: DiscardRequest) -> None:
        shutil.rmtree(
            Path(request.cache_root) / staging_dir(request.operation_id), ignore_errors=True
        )
