"""VerifyWorkflow: prove bytes are what they claim, where they are.

Two uses: a PVC `Direct` source is hashed and inspected in place on its claim (it
is never copied), and an operator's `verify` signal to the ArtifactWorkflow
(`temporal workflow signal --name verify --workflow-id artifact/<ns>/<name>/<uid>`)
starts it as a child to re-hash the artifact: a published blob against its manifest
(a blob that fails is quarantined), or a Direct source in place again. Both run on
the importer's task queue, next to the volume, with progress as heartbeats.
`spec.expectedSHA256` is compared with the artifact digest (the file's sha256, or the
shard set's digest).
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from workflows.importer_calls import HASH, RESOLVE_ON_CLAIM
from workflows.status import TaskStatus

with workflow.unsafe.imports_passed_through():
    from activities.cache import CacheActivities
    from activities.import_payloads import (
        InPlaceArtifact,
        InPlaceRequest,
        PvcSource,
        VerifyPublishedRequest,
    )
    from activities.volume_source import PvcSourceActivities
    from kama.cache_layout import ManifestFile, expected_digest_mismatch
    from kama.reasons import Failure


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
                type=Failure.CHECKSUM_MISMATCH,
                non_retryable=True,
            )
        self._status.doing = "hashing in place"
        found = await HASH.schedule(
            PvcSourceActivities.verify_in_place,
            InPlaceRequest(source=pvc, files=resolved.files, entrypoint=resolved.entrypoint),
            queue=request.importer_task_queue,
        )
        mismatch = expected_digest_mismatch(
            expected=request.expected_sha256,
            files=[ManifestFile(path=f.path, size=f.size, sha256=f.sha256) for f in found.files],
        )
        if mismatch is not None:
            raise ApplicationError(mismatch, type=Failure.CHECKSUM_MISMATCH, non_retryable=True)
        self._status.doing = "verified"
        return VerifyResult(bytes_checked=found.total_size, artifact=found)
