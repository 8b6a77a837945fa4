"""A PersistentVolumeClaim as a model source: files someone put on a volume.

The claim is mounted read-only in the importer pod. Paths are checked before
anything is read: relative only, no `..`, no symlink that leaves the claim, only
regular files (no devices, sockets or FIFOs). `Copy` streams the files into the
cache's staging area (hashing as it copies, resumable while the source file is
unchanged); `Direct` hashes them in place and serves from the claim itself.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path, PurePosixPath

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cache import inspect_artifact
from activities.import_payloads import (
    CopyRequest,
    DownloadedFile,
    InPlaceArtifact,
    InPlaceRequest,
    PvcSource,
    ResolvedFile,
    ResolvedSource,
)
from activities.storage import CHUNK_BYTES, hash_file, resume_partial, staged_file
from kama.cache_layout import (
    InvalidPath,
    Manifest,
    ManifestFile,
    artifact_digest,
    safe_relative_path,
)
from kama.gguf.header import InvalidGGUF
from kama.gguf.shards import MissingShard
from kama.reasons import Failure
from kama.sources import FileSelectionError, SourceFile, entrypoint, select_files

HEARTBEAT_EVERY_S = 1.0


def _refuse(message: str) -> ApplicationError:
    return ApplicationError(message, type=Failure.SOURCE_UNAVAILABLE, non_retryable=True)


def checked_path(*, root: Path, relative: str) -> Path:
    """The real path of `relative` under `root`, refusing anything that escapes it."""
    try:
        safe_relative_path(relative)
    except InvalidPath as exc:
        raise _refuse(str(exc)) from None
    real_root = root.resolve(strict=True)
    candidate = root / relative
    try:
        real = candidate.resolve(strict=True)
    except (FileNotFoundError, RuntimeError):
        raise _refuse(f"path {relative!r} does not exist on the source claim") from None
    if not real.is_relative_to(real_root):
        raise _refuse(f"path {relative!r} resolves outside the source claim (symlink escape)")
    return real


def _regular_file(path: Path, shown: str) -> int:
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        raise _refuse(f"{shown} is not a regular file (devices, sockets and FIFOs are refused)")
    return path.stat().st_size


def source_identity(path: Path) -> str:
    """What a partial copy of `path` may be resumed against: the same inode with the
    same size and modification/change times. A file replaced or rewritten since (even
    in place, with its mtime set back) has another identity, and its copy restarts."""
    info = path.stat()
    return f"{path} dev={info.st_dev} ino={info.st_ino} size={info.st_size} mtime={info.st_mtime_ns} ctime={info.st_ctime_ns}"


def _requested(name: str | None, chosen: list[SourceFile]) -> str | None:
    """``spec.entrypoint`` as the path of one of `chosen` (paths from the claim's root):
    a file name in the source directory, or already such a path. A name that is
    neither is passed on unchanged, for `entrypoint` to refuse it."""
    if name is None or name in {f.path for f in chosen}:
        return name
    for f in chosen:
        if PurePosixPath(f.path).name == name:
            return f.path
    return name


class PvcSourceActivities:
    @activity.defn(name="Resolve volume source")
    def resolve(self, source: PvcSource) -> ResolvedSource:
        root = Path(source.root)
        target = checked_path(root=root, relative=source.path)
        real_root = root.resolve()
        if target.is_dir():
            available = []
            for child in sorted(target.iterdir()):
                if child.name.endswith(".gguf"):
                    real = checked_path(root=root, relative=str(child.relative_to(root)))
                    rel = str(real.relative_to(real_root))
                    available.append(
                        SourceFile(path=rel, size=_regular_file(real, rel), sha256=None)
                    )
            names = [f.path for f in available]
        else:
            rel = str(target.relative_to(real_root))
            available = [SourceFile(path=rel, size=_regular_file(target, rel), sha256=None)]
            names = [rel]
        if not available:
            raise _refuse(f"no .gguf file at {source.path!r}")
        try:
            chosen = select_files(requested=names, available=available)
            model = entrypoint(chosen, requested=_requested(source.entrypoint, chosen))
        except MissingShard as exc:
            raise ApplicationError(
                str(exc), type=Failure.MISSING_SHARD, non_retryable=True
            ) from None
        except FileSelectionError as exc:
            raise _refuse(str(exc)) from None
        return ResolvedSource(
            commit="",
            files=[ResolvedFile(path=f.path, size=f.size, sha256=None) for f in chosen],
            entrypoint=model,
        )

    @activity.defn(name="Copy file into cache staging")
    def copy_file(self, request: CopyRequest) -> DownloadedFile:
        source = checked_path(root=Path(request.source.root), relative=request.file.path)
        target = staged_file(
            root=Path(request.cache_root),
            operation_id=request.operation_id,
            path=Path(request.file.path).name,
        )
        done, digest = resume_partial(
            target=target, origin=source_identity(source), size=request.file.size
        )
        last = 0.0
        with source.open("rb") as src, target.open("ab") as out:
            src.seek(done)
            while block := src.read(CHUNK_BYTES):
                out.write(block)
                digest.update(block)
                done += len(block)
                if time.monotonic() - last >= HEARTBEAT_EVERY_S:
                    activity.heartbeat(done)
                    last = time.monotonic()
            out.flush()
            os.fsync(out.fileno())
        if done != request.file.size:
            raise ApplicationError(
                f"{request.file.path} changed size while copying ({done} != {request.file.size})"
            )
        activity.heartbeat(done)
        return DownloadedFile(
            path=Path(request.file.path).name, size=done, sha256=digest.hexdigest()
        )

    @activity.defn(name="Verify files in place")
    def verify_in_place(self, request: InPlaceRequest) -> InPlaceArtifact:
        root = Path(request.source.root)
        files: list[DownloadedFile] = []
        done = 0
        for f in request.files:
            path = checked_path(root=root, relative=f.path)
            base = done

            def beat(n: int, base: int = base) -> None:
                activity.heartbeat(base + n)

            files.append(
                DownloadedFile(path=f.path, size=f.size, sha256=hash_file(path, on_progress=beat))
            )
            done += f.size
        parent = str(Path(request.entrypoint).parent)
        base_path = "" if parent == "." else parent
        model = Path(request.entrypoint).name
        try:
            found = inspect_artifact(
                directory=root.resolve() / base_path if base_path else root.resolve(),
                files=[
                    DownloadedFile(path=Path(f.path).name, size=f.size, sha256=f.sha256)
                    for f in files
                ],
                entrypoint=model,
            )
        except InvalidGGUF as exc:
            raise ApplicationError(
                str(exc), type=Failure.INVALID_GGUF, non_retryable=True
            ) from None
        except MissingShard as exc:
            raise ApplicationError(
                str(exc), type=Failure.MISSING_SHARD, non_retryable=True
            ) from None
        entries = [
            ManifestFile(path=Path(f.path).name, size=f.size, sha256=f.sha256) for f in files
        ]
        manifest = Manifest.build(files=entries, entrypoint=model)
        return InPlaceArtifact(
            files=files,
            manifest_digest=manifest.digest,
            artifact_digest=artifact_digest(entries),
            total_size=manifest.total_size,
            base_path=base_path,
            facts=found.facts,
            entrypoint=model,
            projector=found.projector,
        )
