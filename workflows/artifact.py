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
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError, ChildWorkflowError

from workflows.kube_calls import KUBE_TIMEOUT, call_kube

with workflow.unsafe.imports_passed_through():
    from activities.kube import (
        CACHE_MOUNT,
        SOURCE_MOUNT,
        TOKEN_MOUNT,
        CacheClaim,
        CacheRequest,
        EventRequest,
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
    from kama.conditions import ConditionUpdate, rfc3339, set_conditions
    from kama.contracts import (
        ARTIFACTS,
        CACHES,
        RETRY,
        SPEC_CHANGED,
        EntitySnapshot,
        ObjectRef,
        import_workflow_id,
        verify_workflow_id,
    )
    from workflows.import_model import ImportInput, ImportResult, ImportWorkflow
    from workflows.verify_model import VerifyInput, VerifyResult, VerifyWorkflow

CLAIM_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=10),
    non_retryable_error_types=["StorageUnavailable"],
)
PROGRESS_EVERY = timedelta(seconds=2)
DELETE_RECHECK = timedelta(seconds=30)
HISTORY_LIMIT = 2000

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


def failure_type(error: BaseException) -> tuple[str, str]:
    """The typed reason behind a failed child workflow or activity."""
    current: BaseException | None = error
    while current is not None:
        if isinstance(current, ApplicationError) and current.type:
            return current.type, current.message
        current = getattr(current, "cause", None) or current.__cause__
    return "ImportFailed", str(error)


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
class ArtifactWorkflow:
    def __init__(self) -> None:
        self._snapshot: EntitySnapshot | None = None
        self._memory = ArtifactMemory()
        self._retry = False
        self._doing = "starting"
        self._last_error: str | None = None

    # signals and queries ------------------------------------------------------

    @workflow.signal(name=SPEC_CHANGED)
    def spec_changed(self, snapshot: EntitySnapshot) -> None:
        if snapshot.supersedes(self._snapshot):
            self._snapshot = snapshot

    @workflow.signal(name=RETRY)
    def retry(self) -> None:
        self._retry = True

    @workflow.query(name="status")
    def status(self) -> dict[str, Any]:
        snap = self._snapshot
        return {
            "doing": self._doing,
            "generation": snap.generation if snap else None,
            "phase": self._memory.status.get("phase"),
            "manifestDigest": self._memory.status.get("manifestDigest"),
            "attempt": self._memory.attempt,
            "lastError": self._last_error,
        }

    # main loop ----------------------------------------------------------------

    @workflow.run
    async def run(self, request: ArtifactInput) -> None:
        if self._snapshot is None or self._snapshot.generation < request.snapshot.generation:
            self._snapshot = request.snapshot
        self._memory = request.memory
        while True:
            snap = self._snapshot
            assert snap is not None
            if snap.deleting:
                await self._finalize(snap)
                return
            if self._memory.imported_generation is None and (
                self._memory.failed_generation != snap.generation or self._retry
            ):
                self._retry = False
                await self._import(snap)
                continue
            self._doing = (
                "ready"
                if self._memory.imported_generation is not None
                else "waiting for retry or a spec change"
            )
            await workflow.wait_condition(self._needs_attention(snap.generation))
            if workflow.info().get_current_history_length() > HISTORY_LIMIT:
                workflow.continue_as_new(
                    ArtifactInput(snapshot=self._snapshot, memory=self._memory)
                )

    def _needs_attention(self, generation: int) -> Callable[[], bool]:
        def check() -> bool:
            snap = self._snapshot
            changed = snap is not None and (snap.deleting or snap.generation != generation)
            return self._retry or changed

        return check

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
        except Exception as exc:
            kind, message = failure_type(exc)
            await self._fail(snap, kind, message, operation, None)
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
        pod: PodRef = await self._kube(KubeActivities.ensure_importer_pod, pod_request)
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
        child: Any
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
                progress: ImportProgress = await self._kube(
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
                await self._kube(
                    KubeActivities.ensure_importer_pod, pod_request
                )  # recreated if it was deleted
            outcome = child.result()
            result: ImportResult = (
                outcome if isinstance(outcome, ImportResult) else in_place_result(outcome)
            )
        except (ChildWorkflowError, ApplicationError) as exc:
            kind, message = failure_type(exc)
            await self._fail(snap, kind, message, operation, pod)
            return
        await self._succeed(snap, result, claim, pod)
        if result.free_bytes is not None and spec.cache_ref is not None:
            cache = ObjectRef(namespace=snap.ref.namespace, name=spec.cache_ref.name, uid="")
            free = {
                "freeBytes": result.free_bytes - result.artifact.total_size,
                "freeReportedAt": rfc3339(workflow.now()),
            }
            await self._kube(
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
        await self._event(snap, "Normal", "Ready", f"Artifact {digest[:19]} is ready ({how})")
        await self._kube(KubeActivities.delete_pod, pod)

    async def _fail(
        self, snap: EntitySnapshot, kind: str, message: str, operation: str, pod: PodRef | None
    ) -> None:
        condition = FAILURE_CONDITIONS.get(kind)
        conditions: list[ConditionUpdate] = [
            (ArtifactCondition.IMPORTING, False, kind, message),
            (ArtifactCondition.READY, False, kind, message),
        ]
        if condition is not None:
            conditions.append((condition, True, kind, message))
        await self._write(snap, phase=ArtifactPhase.FAILED, extra={}, conditions=conditions)
        await self._event(snap, "Warning", kind, message)
        if pod is not None:
            await self._kube(KubeActivities.delete_pod, pod)
        self._memory.failed_generation = snap.generation
        self._last_error = f"{kind}: {message}"

    # deletion -----------------------------------------------------------------

    async def _finalize(self, snap: EntitySnapshot) -> None:
        while True:
            self._doing = "deleting: checking for ModelDeployments that use the artifact"
            users: list[str] = await self._kube(KubeActivities.artifact_users, snap.ref)
            if not users:
                break
            self._doing = f"deletion held: used by {', '.join(users)}"
            await self._event(
                snap,
                "Warning",
                "DeletionBlocked",
                f"still used by ModelDeployment(s) {', '.join(users)}",
            )
            await asyncio.sleep(DELETE_RECHECK.total_seconds())
        await self._kube(
            KubeActivities.release_finalizer, FinalizerRequest(plural=ARTIFACTS, ref=snap.ref)
        )
        self._doing = "deleted (bytes kept in the cache)"

    # helpers ------------------------------------------------------------------

    async def _claim(self, method: Any, snap: EntitySnapshot, name: str) -> CacheClaim:
        claim: CacheClaim = await workflow.execute_activity_method(
            method,
            CacheRequest(namespace=snap.ref.namespace, name=name),
            start_to_close_timeout=KUBE_TIMEOUT,
            retry_policy=CLAIM_RETRY,
        )
        return claim

    async def _kube(self, method: Any, argument: Any) -> Any:
        return await call_kube(method, argument)

    async def _event(self, snap: EntitySnapshot, kind: str, reason: str, message: str) -> None:
        await self._kube(
            KubeActivities.record_event,
            EventRequest(
                kind="ModelArtifact", ref=snap.ref, type=kind, reason=reason, message=message
            ),
        )

    async def _write(
        self,
        snap: EntitySnapshot,
        *,
        phase: str,
        extra: dict[str, Any],
        conditions: list[ConditionUpdate],
    ) -> None:
        status = dict(self._memory.status)
        current = set_conditions(
            list(status.get("conditions", [])),
            conditions,
            now=workflow.now(),
            generation=snap.generation,
        )
        status.update(extra)
        status.update(
            {"phase": str(phase), "observedGeneration": snap.generation, "conditions": current}
        )
        if status == self._memory.status:
            return
        self._memory.status = status
        await self._kube(
            KubeActivities.patch_status,
            StatusPatch(kind_plural=ARTIFACTS, ref=snap.ref, status=status),
        )
