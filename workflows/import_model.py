"""ImportWorkflow: get a model's bytes from its source into the cache, proven.

Resolve the source once (revision → commit, file list, sizes, the source's sha256),
reuse an already published blob with the same manifest, otherwise make room (remove
abandoned staging, check free space), download each file on the importer's task
queue (next to the cache volume; resumable and hashed in one pass), compare every
sha256 and `spec.expectedSHA256` (the artifact digest), inspect the GGUF header and
publish atomically. Bad sources and bad bytes end it with a typed, non-retryable
error.

The partial files live in `.kama/staging/<staging_id>`: the artifact's own staging,
the same for every attempt, so an import started again after a failure (`retry`)
resumes the bytes the last attempt left instead of fetching them from zero.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from workflows.importer_calls import CACHE_CALL, RESOLVE, TRANSFER

with workflow.unsafe.imports_passed_through():
    from activities.cache import CacheActivities, StagingRequest
    from activities.huggingface import HuggingFaceActivities
    from activities.import_payloads import (
        CopyRequest,
        DiscardRequest,
        DownloadedFile,
        DownloadRequest,
        HubSource,
        ImportStatus,
        LookupRequest,
        PublishedArtifact,
        PublishRequest,
        PvcSource,
        ResolvedFile,
        ResolvedSource,
    )
    from activities.volume_source import PvcSourceActivities
    from kama.cache_layout import Manifest, ManifestFile, expected_digest_mismatch
    from kama.contracts import STATUS_QUERY
    from kama.reasons import Failure


@dataclass(frozen=True)
class ImportInput:
    operation_id: str
    source: HubSource | None
    cache_root: str
    importer_task_queue: str
    expected_sha256: str | None = None
    expected_size: int | None = None
    pvc: PvcSource | None = None  # instead of `source`: a file on a claim (Copy or Direct)
    staging_id: str = ""  # the staging directory, kept across attempts; "" = operation_id

    @property
    def staging(self) -> str:
        return self.staging_id or self.operation_id


@dataclass(frozen=True)
class ImportResult:
    commit: str
    files: list[DownloadedFile]
    artifact: PublishedArtifact
    reused: bool
    in_place: bool = False  # PVC Direct: verified where it is, nothing copied
    operation_id: str = ""
    free_bytes: int | None = None  # free space of the cache before the download


def _mismatch(message: str) -> ApplicationError:
    return ApplicationError(message, type=Failure.CHECKSUM_MISMATCH, non_retryable=True)


@workflow.defn(name="Import model")
class ImportWorkflow:
    def __init__(self) -> None:
        self._status = ImportStatus(doing="resolving the source")

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> ImportStatus:
        return self._status

    @workflow.run
    async def run(self, request: ImportInput) -> ImportResult:
        resolved = await self._resolve(request)
        self._status.commit = resolved.commit
        self._status.files = [f.path for f in resolved.files]
        self._status.files_total = len(resolved.files)
        self._status.bytes_total = resolved.total_size
        self._check_expectations(request, resolved)

        if request.pvc is not None and request.pvc.direct:
            raise ApplicationError(
                "Direct sources are verified in place by VerifyWorkflow, not imported",
                type=Failure.SOURCE_UNAVAILABLE,
                non_retryable=True,
            )

        reused = await self._published_already(request, resolved)
        if reused is not None:
            self._status.doing, self._status.reused = "published (reused)", True
            return reused

        self._status.doing = "importing"
        free_bytes = await self._make_room(request, resolved)
        downloaded: list[DownloadedFile] = []
        for file in resolved.files:
            result = await self._fetch(request, resolved, file)
            expected = file.sha256
            if len(resolved.files) == 1 and request.expected_sha256:
                expected = request.expected_sha256
            if expected is not None and result.sha256 != expected:
                await self._discard(request)
                self._status.last_error = f"{file.path}: sha256 {result.sha256} != {expected}"
                raise _mismatch(self._status.last_error)
            downloaded.append(result)
            self._status.files_done += 1
            self._status.bytes_completed += result.size
        mismatch = self._expected_digest(request, downloaded)
        if mismatch is not None:
            await self._discard(request)
            self._status.last_error = mismatch
            raise _mismatch(mismatch)

        self._status.doing = "publishing"
        try:
            artifact = await self._publish(
                request,
                files=downloaded,
                entrypoint=resolved.entrypoint
                if request.pvc is None
                else resolved.entrypoint.rsplit("/", 1)[-1],
            )
        except ActivityError:
            # a final refusal (InvalidGGUF, MissingShard, attempts used up): the staged
            # bytes can never be published, so they do not stay on the volume
            await self._discard(request)
            raise
        self._status.doing = "published"
        return ImportResult(
            commit=resolved.commit,
            files=downloaded,
            artifact=artifact,
            reused=False,
            operation_id=request.operation_id,
            free_bytes=free_bytes,
        )

    async def _make_room(self, request: ImportInput, resolved: ResolvedSource) -> int:
        """Free bytes before the download, once stale staging is removed and this
        import's partial files are counted; InsufficientStorage when it does not fit."""
        return await CACHE_CALL.schedule(
            CacheActivities.prepare_staging,
            StagingRequest(
                cache_root=request.cache_root,
                staging_id=request.staging,
                needed_bytes=resolved.total_size,
            ),
            queue=request.importer_task_queue,
        )

    @staticmethod
    def _expected_digest(
        request: ImportInput, files: list[DownloadedFile] | list[ResolvedFile]
    ) -> str | None:
        """Why a shard set is not the artifact `spec.expectedSHA256` names (a single
        file is checked file by file). Files without a sha256 are not compared."""
        if len(files) < 2 or any(f.sha256 is None for f in files):
            return None
        return expected_digest_mismatch(
            expected=request.expected_sha256,
            files=[ManifestFile(path=f.path, size=f.size, sha256=f.sha256 or "") for f in files],
        )

    async def _resolve(self, request: ImportInput) -> ResolvedSource:
        if request.pvc is not None:
            return await RESOLVE.schedule(
                PvcSourceActivities.resolve, request.pvc, queue=request.importer_task_queue
            )
        if request.source is None:
            raise ApplicationError(
                "the import names no source", type=Failure.SOURCE_UNAVAILABLE, non_retryable=True
            )
        return await RESOLVE.schedule(
            HuggingFaceActivities.resolve_source,
            request.source,
            queue=request.importer_task_queue,
        )

    async def _fetch(
        self, request: ImportInput, resolved: ResolvedSource, file: ResolvedFile
    ) -> DownloadedFile:
        if request.pvc is not None:
            return await TRANSFER.schedule(
                PvcSourceActivities.copy_file,
                CopyRequest(
                    source=request.pvc,
                    file=file,
                    cache_root=request.cache_root,
                    operation_id=request.staging,
                ),
                queue=request.importer_task_queue,
            )
        assert request.source is not None
        return await TRANSFER.schedule(
            HuggingFaceActivities.download_file,
            DownloadRequest(
                source=request.source,
                commit=resolved.commit,
                file=file,
                cache_root=request.cache_root,
                operation_id=request.staging,
            ),
            queue=request.importer_task_queue,
        )

    def _check_expectations(self, request: ImportInput, resolved: ResolvedSource) -> None:
        if request.expected_size is not None and resolved.total_size != request.expected_size:
            raise _mismatch(
                f"source has {resolved.total_size} bytes, spec.expectedSize is {request.expected_size}"
            )
        if request.expected_sha256 and len(resolved.files) == 1:
            claimed = resolved.files[0].sha256
            if claimed is not None and claimed != request.expected_sha256:
                raise _mismatch(
                    f"source reports sha256 {claimed}, spec.expectedSHA256 is {request.expected_sha256}"
                )
        claimed_set = self._expected_digest(request, resolved.files)
        if claimed_set is not None:
            raise _mismatch(f"by the source's own sha256s, {claimed_set}")

    async def _published_already(
        self, request: ImportInput, resolved: ResolvedSource
    ) -> ImportResult | None:
        if any(f.sha256 is None for f in resolved.files):
            return None
        files = [
            DownloadedFile(path=f.path, size=f.size, sha256=f.sha256 or "") for f in resolved.files
        ]
        manifest = Manifest.build(
            files=[ManifestFile(path=f.path, size=f.size, sha256=f.sha256) for f in files],
            entrypoint=resolved.entrypoint,
        )
        found = await CACHE_CALL.schedule(
            CacheActivities.lookup,
            LookupRequest(cache_root=request.cache_root, manifest_digest=manifest.digest),
            queue=request.importer_task_queue,
        )
        if not found:
            return None
        artifact = await self._publish(request, files=files, entrypoint=resolved.entrypoint)
        return ImportResult(
            commit=resolved.commit,
            files=files,
            artifact=artifact,
            reused=True,
            operation_id=request.operation_id,
        )

    async def _publish(
        self, request: ImportInput, *, files: list[DownloadedFile], entrypoint: str
    ) -> PublishedArtifact:
        return await CACHE_CALL.schedule(
            CacheActivities.publish,
            PublishRequest(
                cache_root=request.cache_root,
                operation_id=request.staging,
                files=files,
                entrypoint=entrypoint,
            ),
            queue=request.importer_task_queue,
        )

    async def _discard(self, request: ImportInput) -> None:
        await CACHE_CALL.schedule(
            CacheActivities.discard_staging,
            DiscardRequest(cache_root=request.cache_root, operation_id=request.staging),
            queue=request.importer_task_queue,
        )
