"""ArtifactWorkflow: the entity workflow of one ModelArtifact (`artifact/<ns>/<name>/<uid>`).

Started (or nudged) by the watcher with the latest spec. It finds the cache claim,
starts an importer pod next to the volume, runs ImportWorkflow as a child while it
mirrors progress into the status, records the result (commit, per-file sha256,
digests, GGUF facts, serving location) and conditions, and then waits. A failed
import waits for a `retry` signal or a spec change. On deletion it holds the
finalizer while any ModelDeployment still references the artifact; the bytes stay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

from workflows.entity import AGAIN, EntityWorkflow, Rest
from workflows.kube_calls import CLAIM, call_kube, failure_type

with workflow.unsafe.imports_passed_through():
    from activities.kube import (
        CACHE_MOUNT,
        SOURCE_MOUNT,
        TOKEN_MOUNT,
        CacheClaim,
        CacheRequest,
        FinalizerRequest,
        ImporterPod,
        KubeActivities,
        PodRef,
        StatusPatch,
    )
    from activities.models import HuggingFaceSource, PublishedArtifact, PvcSource
    from activities.progress import ImportProgress, ProgressActivities, ProgressRequest
    from kama.api import ArtifactCondition, ArtifactPhase, ModelArtifactSpec
    from kama.cache_layout import blob_dir
    from kama.conditions import ConditionUpdate, rfc3339, updated_status
    from kama.contracts import (
        ARTIFACTS,
        CACHES,
        STATUS_QUERY,
        EntitySnapshot,
        ObjectRef,
        WorkflowStatus,
        import_workflow_id,
        verify_workflow_id,
    )
    from workflows.import_model import ImportInput, ImportResult, ImportWorkflow
    from workflows.verify_model import VerifyInput, VerifyResult, VerifyWorkflow

PROGRESS_EVERY = timedelta(seconds=2)
DELETE_RECHECK = timedelta(seconds=30)

IMPORT_FAILED = "ImportFailed"  # the reason of a failure that names no type of its own
FAILURE_CONDITIONS = {
    "ChecksumMismatch": ArtifactCondition.CHECKSUM_MISMATCH,
    "InvalidGGUF": ArtifactCondition.INVALID_GGUF,
    "MissingShard": ArtifactCondition.MISSING_SHARD,
    "InsufficientStorage": ArtifactCondition.INSUFFICIENT_STORAGE,
    "SourceUnavailable": ArtifactCondition.SOURCE_UNAVAILABLE,
    "StorageUnavailable": ArtifactCondition.INSUFFICIENT_STORAGE,
}


@dataclass
class ArtifactMemory:
    """State carried across continue-as-new."""

    status: dict[str, Any] = field(default_factory=dict)
    imported_generation: int | None = None
    failed_generation: int | None = None
    attempt: int = 0


@dataclass(frozen=True)
class ArtifactInput:
    snapshot: EntitySnapshot
    memory: ArtifactMemory = field(default_factory=ArtifactMemory)


@dataclass
class ArtifactWorkflowStatus(WorkflowStatus):
    """The `status` answer of an ArtifactWorkflow."""

    phase: str | None = None
    manifest_digest: str | None = None
    attempt: int = 0


ImportChild = (
    workflow.ChildWorkflowHandle[ImportWorkflow, ImportResult]
    | workflow.ChildWorkflowHandle[VerifyWorkflow, VerifyResult]
)
ClaimActivity = Callable[[KubeActivities, CacheRequest], CacheClaim]


def in_place_result(verified: VerifyResult) -> ImportResult:
    """A Direct source's verification, in the shape of an import result."""
    found = verified.artifact
    assert found is not None
    artifact = PublishedArtifact(
        manifest_digest=found.manifest_digest,
        artifact_digest=found.artifact_digest,
        total_size=found.total_size,
        directory=found.base_path,
        facts=found.facts,
    )
    return ImportResult(
        commit="", files=found.files, artifact=artifact, reused=False, in_place=True
    )


@workflow.defn(name="Keep model artifact")
class ArtifactWorkflow(EntityWorkflow):
    plural = ARTIFACTS
    kind = "ModelArtifact"

    def __init__(self) -> None:
        super().__init__()
        self._memory = ArtifactMemory()
        self._last_error: str | None = None

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> ArtifactWorkflowStatus:
        found = self._memory.status
        return self._answer(
            ArtifactWorkflowStatus(
                phase=found.get("phase"),
                manifest_digest=found.get("manifestDigest"),
                attempt=self._memory.attempt,
                last_error=self._last_error,
            )
        )

    # main loop ----------------------------------------------------------------

    @workflow.run
    async def run(self, request: ArtifactInput) -> None:
        self._memory = request.memory
        await self._keep(request.snapshot)

    async def _reconcile(self, snap: EntitySnapshot, *, retry: bool) -> Rest | None:
        if self._memory.imported_generation is None and (
            self._memory.failed_generation != snap.generation or retry
        ):
            await self._import(snap)
            return AGAIN
        self._doing = (
            "ready"
            if self._memory.imported_generation is not None
            else "waiting for retry or a spec change"
        )
        return Rest()

    async def _report(self, snap: EntitySnapshot, *, reason: str, message: str) -> None:
        await self._fail(snap, reason, message, pod=None)

    def _carried_over(self) -> ArtifactInput:
        assert self._snapshot is not None
        return ArtifactInput(snapshot=self._snapshot, memory=self._memory)

    # import -------------------------------------------------------------------

    async def _import(self, snap: EntitySnapshot) -> None:
        spec = ModelArtifactSpec.model_validate(snap.spec)
        self._memory.attempt += 1
        operation = f"{snap.ref.uid[:8]}-g{snap.generation}-a{self._memory.attempt}"
        await self._write(
            snap,
            phase=ArtifactPhase.RESOLVING,
            extra={},
            conditions=[
                (ArtifactCondition.READY, False, "Importing", "the artifact is being imported"),
            ],
        )
        hf = spec.source.hugging_face
        pvc = spec.source.persistent_volume_claim
        direct = pvc is not None and str(pvc.mode) == "Direct"
        self._doing = "finding the claims"
        try:
            if direct:
                assert pvc is not None
                claim: CacheClaim = await self._claim(
                    KubeActivities.source_claim, snap, pvc.claim_name
                )
            else:
                assert spec.cache_ref is not None  # the schema requires it for HF and Copy
                claim = await self._claim(KubeActivities.cache_claim, snap, spec.cache_ref.name)
                if pvc is not None:
                    await self._claim(KubeActivities.source_claim, snap, pvc.claim_name)
        except ActivityError as exc:
            kind, message = failure_type(exc, default=IMPORT_FAILED)
            await self._fail(snap, kind, message, pod=None)
            return
        queue = f"kama-importer-{operation}"
        token = hf.token_secret_ref if hf is not None else None
        pod_request = ImporterPod(
            ref=snap.ref,
            operation_id=operation,
            task_queue=queue,
            cache_claim=None if direct else claim.claim_name,
            source_claim=pvc.claim_name if pvc is not None else None,
            token_secret=token.name if token else None,
            token_key=token.key if token else None,
        )
        self._doing = "starting the importer"
        pod = await call_kube(KubeActivities.ensure_importer_pod, pod_request)
        child_id = import_workflow_id(snap.ref, operation=operation)
        import_input = ImportInput(
            operation_id=operation,
            source=None
            if hf is None
            else HuggingFaceSource(
                repo=hf.repo,
                revision=hf.revision,
                files=list(hf.files),
                token_path=f"{TOKEN_MOUNT}/token" if token else None,
            ),
            pvc=None if pvc is None else PvcSource(root=SOURCE_MOUNT, path=pvc.path, direct=direct),
            cache_root="" if direct else CACHE_MOUNT,
            importer_task_queue=queue,
            expected_sha256=spec.expected_sha256,
            expected_size=spec.expected_size,
        )
        origin = hf.repo if hf is not None else f"claim {pvc.claim_name if pvc else ''}"
        self._doing = "importing"
        await self._write(
            snap,
            phase=ArtifactPhase.VERIFYING if direct else ArtifactPhase.IMPORTING,
            extra={},
            conditions=[
                (
                    ArtifactCondition.IMPORTING,
                    not direct,
                    "Verifying" if direct else "Downloading",
                    f"importer pod {pod.name} is {'verifying' if direct else 'copying'} from {origin}",
                ),
            ],
        )
        child: ImportChild
        if direct:
            assert import_input.pvc is not None
            child = await workflow.start_child_workflow(
                VerifyWorkflow.run,
                VerifyInput(
                    importer_task_queue=queue,
                    pvc=import_input.pvc,
                    expected_sha256=spec.expected_sha256,
                    expected_size=spec.expected_size,
                ),
                id=verify_workflow_id(snap.ref, operation=operation),
                task_queue=workflow.info().task_queue,
                search_attributes=workflow.info().typed_search_attributes,
            )
        else:
            child = await workflow.start_child_workflow(
                ImportWorkflow.run,
                import_input,
                id=child_id,
                task_queue=workflow.info().task_queue,
                search_attributes=workflow.info().typed_search_attributes,
            )
        try:
            while True:
                done, _ = await workflow.wait([child], timeout=PROGRESS_EVERY.total_seconds())
                if done:
                    break
                progress: ImportProgress = await call_kube(
                    ProgressActivities.import_progress, ProgressRequest(workflow_id=child_id)
                )
                if progress.bytes_total:
                    await self._write(
                        snap,
                        phase=ArtifactPhase.IMPORTING,
                        extra={
                            "progress": {
                                "bytesDone": progress.bytes_done,
                                "bytesTotal": progress.bytes_total,
                            }
                        },
                        conditions=[],
                    )
                await call_kube(
                    KubeActivities.ensure_importer_pod, pod_request
                )  # recreated if it was deleted
            outcome = child.result()
            result: ImportResult = (
                outcome if isinstance(outcome, ImportResult) else in_place_result(outcome)
            )
        except (ChildWorkflowError, ActivityError, ApplicationError) as exc:
            if not child.done():  # a call of our own failed for good: stop the import
                child.cancel()
            kind, message = failure_type(exc, default=IMPORT_FAILED)
            await self._fail(snap, kind, message, pod=pod)
            return
        await self._succeed(snap, result, claim, pod)
        if result.free_bytes is not None and spec.cache_ref is not None:
            cache = ObjectRef(namespace=snap.ref.namespace, name=spec.cache_ref.name, uid="")
            free = {
                "freeBytes": result.free_bytes - result.artifact.total_size,
                "freeReportedAt": rfc3339(workflow.now()),
            }
            await call_kube(
                KubeActivities.patch_status, StatusPatch(kind_plural=CACHES, ref=cache, status=free)
            )

    async def _succeed(
        self, snap: EntitySnapshot, result: ImportResult, claim: CacheClaim, pod: PodRef
    ) -> None:
        art = result.artifact
        digest = f"sha256:{art.manifest_digest}"
        extra: dict[str, Any] = {
            "files": [
                {"path": f.path, "size": f.size, "sha256": f.sha256}
                for f in sorted(result.files, key=lambda f: f.path)
            ],
            "manifestDigest": digest,
            "artifactDigest": f"sha256:{art.artifact_digest}",
            "shortDigest": art.artifact_digest[:12],
            "totalSize": art.total_size,
            "gguf": {k: v for k, v in art.facts.items() if v is not None},
            "servingLocation": {
                "claimName": claim.claim_name,
                "subPath": art.directory if result.in_place else str(blob_dir(art.manifest_digest)),
                "accessModes": claim.access_modes,
            },
            "progress": {"bytesDone": art.total_size, "bytesTotal": art.total_size},
        }
        if result.commit:
            extra["resolvedCommit"] = result.commit
        how = (
            "reused the published blob"
            if result.reused
            else f"downloaded {len(result.files)} file(s)"
        )
        await self._write(
            snap,
            phase=ArtifactPhase.READY,
            extra=extra,
            conditions=[
                (
                    ArtifactCondition.SOURCE_RESOLVED,
                    True,
                    "Resolved",
                    f"revision resolved to commit {result.commit}"
                    if result.commit
                    else "files found on the source claim",
                ),
                (ArtifactCondition.IMPORTING, False, "Imported", how),
                (
                    ArtifactCondition.VERIFIED,
                    True,
                    "ChecksumsMatch",
                    "sha256 of every file matches the source",
                ),
                *[(c, False, "Imported", "") for c in FAILURE_CONDITIONS.values()],
                (ArtifactCondition.READY, True, "Published", f"published as {digest}"),
            ],
        )
        self._memory.imported_generation = snap.generation
        self._memory.failed_generation = None
        self._last_error = None
        await self._record(
            snap, type="Normal", reason="Ready", message=f"Artifact {digest[:19]} is ready ({how})"
        )
        await call_kube(KubeActivities.delete_pod, pod)

    async def _fail(
        self, snap: EntitySnapshot, kind: str, message: str, *, pod: PodRef | None
    ) -> None:
        condition = FAILURE_CONDITIONS.get(kind)
        conditions: list[ConditionUpdate] = [
            (ArtifactCondition.IMPORTING, False, kind, message),
            (ArtifactCondition.READY, False, kind, message),
        ]
        if condition is not None:
            conditions.append((condition, True, kind, message))
        await self._write(snap, phase=ArtifactPhase.FAILED, extra={}, conditions=conditions)
        await self._record(snap, type="Warning", reason=kind, message=message)
        if pod is not None:
            await call_kube(KubeActivities.delete_pod, pod)
        self._memory.failed_generation = snap.generation
        self._last_error = f"{kind}: {message}"

    # deletion -----------------------------------------------------------------

    async def _finalize(self, snap: EntitySnapshot) -> None:
        while True:
            self._doing = "deleting: checking for ModelDeployments that use the artifact"
            users = await call_kube(KubeActivities.artifact_users, snap.ref)
            if not users:
                break
            self._doing = f"deletion held: used by {', '.join(users)}"
            await self._record(
                snap,
                type="Warning",
                reason="DeletionBlocked",
                message=f"still used by ModelDeployment(s) {', '.join(users)}",
            )
            await asyncio.sleep(DELETE_RECHECK.total_seconds())
        await call_kube(
            KubeActivities.release_finalizer, FinalizerRequest(plural=ARTIFACTS, ref=snap.ref)
        )
        self._doing = "deleted (bytes kept in the cache)"

    # helpers ------------------------------------------------------------------

    async def _claim(self, method: ClaimActivity, snap: EntitySnapshot, name: str) -> CacheClaim:
        return await CLAIM.schedule(method, CacheRequest(namespace=snap.ref.namespace, name=name))

    async def _write(
        self,
        snap: EntitySnapshot,
        *,
        phase: str,
        extra: dict[str, Any],
        conditions: list[ConditionUpdate],
    ) -> None:
        status = updated_status(
            self._memory.status,
            conditions,
            fields={**extra, "phase": str(phase)},
            now=workflow.now(),
            generation=snap.generation,
        )
        if await self._write_status(snap, written=self._memory.status, status=status):
            self._memory.status = status
