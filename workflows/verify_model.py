"""VerifyWorkflow: prove bytes are what they claim, where they are.

Two uses: a PVC `Direct` source is hashed and inspected in place on its claim (it
is never copied), and an operator's `verify` signal re-hashes a published blob in
the cache against its manifest. Both run on the importer's task queue, next to
the volume, with progress as heartbeats.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from workflows.importer_calls import HASH, RESOLVE_ON_CLAIM
from workflows.status import TaskStatus

with workflow.unsafe.imports_passed_through():
    from activities.cache import CacheActivities
    from activities.models import (
        InPlaceArtifact,
        InPlaceRequest,
        PvcSource,
        VerifyPublishedRequest,
    )
    from activities.volume_source import PvcSourceActivities


@dataclass(frozen=True)
class VerifyInput:
    importer_task_queue: str
    pvc: PvcSource | None = None  # Direct source: hash in place
    cache_root: str = ""  # or: re-hash this published blob
    manifest_digest: str = ""
    expected_sha256: str | None = None
    expected_size: int | None = None


@dataclass(frozen=True)
class VerifyResult:
    bytes_checked: int
    artifact: InPlaceArtifact | None = None


@workflow.defn(name="Verify model")
class VerifyWorkflow(TaskStatus):
    @workflow.run
    async def run(self, request: VerifyInput) -> VerifyResult:
        if request.pvc is not None:
            return await self._in_place(request, request.pvc)
        self._status.doing = "re-hashing the published artifact"
        checked = await HASH.schedule(
            CacheActivities.verify_published,
            VerifyPublishedRequest(
                cache_root=request.cache_root, manifest_digest=request.manifest_digest
            ),
            queue=request.importer_task_queue,
        )
        self._status.doing = "verified"
        return VerifyResult(bytes_checked=checked)

    async def _in_place(self, request: VerifyInput, pvc: PvcSource) -> VerifyResult:
        self._status.doing = "resolving files on the claim"
        resolved = await RESOLVE_ON_CLAIM.schedule(
            PvcSourceActivities.resolve, pvc, queue=request.importer_task_queue
        )
        if request.expected_size is not None and resolved.total_size != request.expected_size:
            raise ApplicationError(
                f"source has {resolved.total_size} bytes, spec.expectedSize is {request.expected_size}",
                type="ChecksumMismatch",
                non_retryable=True,
            )
        self._status.doing = "hashing in place"
        found = await HASH.schedule(
            PvcSourceActivities.verify_in_place,
            InPlaceRequest(source=pvc, files=resolved.files, entrypoint=resolved.entrypoint),
            queue=request.importer_task_queue,
        )
        if (
            request.expected_sha256
            and len(found.files) == 1
            and found.files[0].sha256 != request.expected_sha256
        ):
            raise ApplicationError(
                f"{found.files[0].path}: sha256 {found.files[0].sha256} != spec.expectedSHA256 {request.expected_sha256}",
                type="ChecksumMismatch",
                non_retryable=True,
            )
        self._status.doing = "verified"
        return VerifyResult(bytes_checked=found.total_size, artifact=found)
