"""VerifyWorkflow: prove bytes are what they claim, where they are.

Two uses: a PVC `Direct` source is hashed and inspected in place on its claim (it
is never copied), and an operator's `verify` signal re-hashes a published blob in
the cache against its manifest. Both run on the importer's task queue, next to
the volume, with progress as heartbeats.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from workflows.importer_calls import CallPolicy, on_importer

with workflow.unsafe.imports_passed_through():
    from activities.cache import CacheActivities
    from activities.models import (
        InPlaceArtifact,
        InPlaceRequest,
        PvcSource,
        ResolvedSource,
        VerifyPublishedRequest,
    )
    from activities.volume_source import PvcSourceActivities

RESOLVE_TIMEOUT = timedelta(minutes=2)
HASH_TIMEOUT = timedelta(hours=6)
HASH_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
VERIFY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
)
RESOLVE_ON_CLAIM = CallPolicy(timeout=RESOLVE_TIMEOUT, retry=VERIFY_RETRY)
HASH = CallPolicy(timeout=HASH_TIMEOUT, retry=VERIFY_RETRY, heartbeat=HASH_HEARTBEAT_TIMEOUT)


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
class VerifyWorkflow:
    def __init__(self) -> None:
        self._phase = "starting"

    @workflow.query(name="status")
    def status(self) -> dict[str, str]:
        return {"phase": self._phase}

    @workflow.run
    async def run(self, request: VerifyInput) -> VerifyResult:
        if request.pvc is not None:
            return await self._in_place(request, request.pvc)
        self._phase = "re-hashing the published artifact"
        checked: int = await on_importer(
            CacheActivities.verify_published,
            VerifyPublishedRequest(
                cache_root=request.cache_root, manifest_digest=request.manifest_digest
            ),
            queue=request.importer_task_queue,
            policy=HASH,
        )
        self._phase = "verified"
        return VerifyResult(bytes_checked=checked)

    async def _in_place(self, request: VerifyInput, pvc: PvcSource) -> VerifyResult:
        self._phase = "resolving files on the claim"
        resolved: ResolvedSource = await on_importer(
            PvcSourceActivities.resolve,
            pvc,
            queue=request.importer_task_queue,
            policy=RESOLVE_ON_CLAIM,
        )
        if request.expected_size is not None and resolved.total_size != request.expected_size:
            raise ApplicationError(
                f"source has {resolved.total_size} bytes, spec.expectedSize is {request.expected_size}",
                type="ChecksumMismatch",
                non_retryable=True,
            )
        self._phase = "hashing in place"
        found: InPlaceArtifact = await on_importer(
            PvcSourceActivities.verify_in_place,
            InPlaceRequest(source=pvc, files=resolved.files, entrypoint=resolved.entrypoint),
            queue=request.importer_task_queue,
            policy=HASH,
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
        self._phase = "verified"
        return VerifyResult(bytes_checked=found.total_size, artifact=found)
