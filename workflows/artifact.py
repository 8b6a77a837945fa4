"""ArtifactWorkflow: the entity workflow of one ModelArtifact (`artifact/<ns>/<name>/<uid>`).

Started (or nudged) by the watcher with the latest spec. It finds the cache claim,
starts an importer pod next to the volume, runs ImportWorkflow as a child while it
mirrors progress into the status, records the result (commit, per-file sha256,
digests, GGUF facts, serving location) and conditions, and then waits. A failed
import waits for a `retry` signal or a spec change; every attempt stages its bytes in
the artifact's own staging directory, so a retried download resumes where the last
attempt stopped. The import tells the cache how much room it found (the cache's
`InsufficientCapacity`). A `verify` signal re-hashes the Ready artifact on demand
(a VerifyWorkflow child next to the volume); bytes that no longer match make it
Failed with ChecksumMismatch until `retry` imports it again. On deletion it holds the
finalizer while any ModelDeployment still references the artifact; the bytes stay.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar, cast

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    FailureError,
)

from workflows.artifact_outcomes import (
    failure_conditions,
    how_imported,
    in_place_result,
    is_direct,
    published_status,
    shortage,
)
from workflows.entity import AGAIN, HISTORY_LIMIT, EntityWorkflow, Rest
from workflows.kube_calls import CLAIM, call_kube, failure_type
from workflows.polling import poll_interval

with workflow.unsafe.imports_passed_through():
    from activities.claims import CacheClaim, CacheRequest
    from activities.import_payloads import HubSource, PvcSource
    from activities.importer_pods import ImporterPod, PodRef
    from activities.kama_objects import FinalizerRequest
    from activities.kube import KubeActivities
    from kama.api import (
        ArtifactCondition,
        ArtifactPhase,
        ModelArtifactSpec,
        ModelArtifactStatus,
    )
    from kama.conditions import ConditionUpdate, rfc3339, status_json, updated_status_model
    from kama.contracts import (
        ARTIFACTS,
        CAPACITY_REPORT,
        STATUS_QUERY,
        VERIFY,
        CapacityReport,
        EntitySnapshot,
        ObjectRef,
        WorkflowStatus,
        artifact_workflow_id,
        cache_workflow_id,
        import_workflow_id,
        importer_task_queue,
        verify_workflow_id,
    )
    from kama.importer_pod import CACHE_MOUNT, SOURCE_MOUNT
    from kama.reasons import ArtifactReason, Failure
    from workflows.import_model import ImportInput, ImportResult, ImportWorkflow
    from workflows.import_watch import ImportWatchWorkflow, WatchInput, watch_workflow_id
    from workflows.verify_model import VerifyInput, VerifyResult, VerifyWorkflow

DELETE_RECHECK = timedelta(seconds=30)
DELETE_RECHECK_MAX = timedelta(minutes=5)
"""A deletion held by ModelDeployments that use the artifact is rechecked after 30 s,
then less often, up to every 5 minutes (such a hold can last days)."""

Result = TypeVar("Result")


@dataclass
class ArtifactMemory:
    """State carried across continue-as-new."""

    status: dict[str, Any] = field(default_factory=dict)  # as last written (`status_json`)
    imported_generation: int | None = None
    failed_generation: int | None = None
    attempt: int = 0
    verifications: int = 0  # `verify` signals acted on
    verify_requested: bool = False  # a `verify` signal not acted on yet
    deletion_held_by: list[str] | None = None  # users named by the last DeletionBlocked


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
    verifications: int = 0


ImportChild = (
    workflow.ChildWorkflowHandle[ImportWorkflow, ImportResult]
    | workflow.ChildWorkflowHandle[VerifyWorkflow, VerifyResult]
)
ClaimActivity = Callable[[KubeActivities, CacheRequest], CacheClaim]


@workflow.defn(name="Keep model artifact")
class ArtifactWorkflow(EntityWorkflow):
    plural = ARTIFACTS
    kind = "ModelArtifact"

    @staticmethod
    def workflow_id_for(ref: ObjectRef) -> str:
        return artifact_workflow_id(ref)

    @staticmethod
    def carries_memory(request: ArtifactInput) -> bool:
        return bool(request.memory != ArtifactMemory())

    def __init__(self) -> None:
        super().__init__()
        self._memory = ArtifactMemory()
        self._status = ModelArtifactStatus()  # as last written (`_memory.status`, typed)
        self._last_error: str | None = None

    @workflow.signal(name=VERIFY)
    def verify(self) -> None:
        """Re-hash the Ready artifact now (`temporal workflow signal --name verify
        --workflow-id artifact/<ns>/<name>/<uid>`): a VerifyWorkflow child re-reads every
        byte next to the volume. Ignored while nothing is published."""
        self._memory.verify_requested = True

    def _woken(self, snap: EntitySnapshot) -> bool:
        return self._memory.verify_requested or super()._woken(snap)

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> ArtifactWorkflowStatus:
        phase = self._status.phase
        return self._answer(
            ArtifactWorkflowStatus(
                phase=None if phase is None else str(phase),
                manifest_digest=self._status.manifest_digest,
                attempt=self._memory.attempt,
                verifications=self._memory.verifications,
                last_error=self._last_error,
            )
        )

    # main loop ----------------------------------------------------------------

    @workflow.run
    async def run(self, request: ArtifactInput) -> None:
        self._memory = request.memory
        self._status = ModelArtifactStatus.model_validate(request.memory.status)
        await self._keep(request.snapshot)

    async def _reconcile(self, snap: EntitySnapshot, *, retry: bool) -> Rest | None:
        if self._memory.imported_generation is None and (
            self._memory.failed_generation != snap.generation or retry
        ):
            await self._import(snap)
            return AGAIN
        if self._memory.verify_requested:
            self._memory.verify_requested = False
            if self._memory.imported_generation is not None:
                await self._verify(snap)
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
            ModelArtifactStatus(phase=ArtifactPhase.RESOLVING),
            conditions=[
                (
                    ArtifactCondition.READY,
                    False,
                    ArtifactReason.IMPORTING,
                    "the artifact is being imported",
                ),
            ],
        )
        hf = spec.source.hugging_face
        pvc = spec.source.persistent_volume_claim
        direct = is_direct(spec)
        try:
            claim = await self._claims(snap, spec, with_source=True)
        except ActivityError as exc:
            kind, message = failure_type(exc, default=Failure.IMPORT_FAILED)
            await self._fail(snap, kind, message, pod=None)
            return
        token = hf.token_secret_ref if hf is not None else None
        pod_request = self._importer(snap, spec, operation, with_token=token is not None)
        queue = importer_task_queue(snap.ref, operation=operation)
        self._doing = "starting the importer"
        pod = await call_kube(KubeActivities.ensure_importer_pod, pod_request)
        child_id = import_workflow_id(snap.ref, operation=operation)
        import_input = ImportInput(
            operation_id=operation,
            source=None
            if hf is None
            else HubSource(
                repo=hf.repo,
                revision=hf.revision,
                files=list(hf.files),
                use_token=token is not None,
                entrypoint=spec.entrypoint,
            ),
            pvc=None
            if pvc is None
            else PvcSource(
                root=SOURCE_MOUNT, path=pvc.path, direct=direct, entrypoint=spec.entrypoint
            ),
            cache_root="" if direct else CACHE_MOUNT,
            importer_task_queue=queue,
            expected_sha256=spec.expected_sha256,
            expected_size=spec.expected_size,
            staging_id=f"artifact-{snap.ref.uid}",
        )
        origin = hf.repo if hf is not None else f"claim {pvc.claim_name if pvc else ''}"
        self._doing = "importing"
        await self._write(
            snap,
            ModelArtifactStatus(
                phase=ArtifactPhase.VERIFYING if direct else ArtifactPhase.IMPORTING
            ),
            conditions=[
                (
                    ArtifactCondition.IMPORTING,
                    not direct,
                    ArtifactReason.VERIFYING if direct else ArtifactReason.DOWNLOADING,
                    f"importer pod {pod.name} is {'verifying' if direct else 'copying'} from {origin}",
                ),
            ],
        )
        child: ImportChild
        if direct:
            assert import_input.pvc is not None
            child = await self._start_verify(
                snap,
                operation,
                VerifyInput(
                    importer_task_queue=queue,
                    pvc=import_input.pvc,
                    expected_sha256=spec.expected_sha256,
                    expected_size=spec.expected_size,
                ),
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
            outcome = cast(
                "ImportResult | VerifyResult",
                await self._watch(snap, child, pod_request, progress_of=child_id),
            )
            result: ImportResult = (
                outcome if isinstance(outcome, ImportResult) else in_place_result(outcome)
            )
        except (ChildWorkflowError, ActivityError, ApplicationError) as exc:
            if not child.done():  # a call of our own failed for good: stop the import
                child.cancel()
            kind, message = failure_type(exc, default=Failure.IMPORT_FAILED)
            await self._fail(snap, kind, message, pod=pod)
            found = shortage(exc)
            if found is not None:
                free, needed = found
                await self._tell_cache(snap, spec, claim, needed=needed, free=free)
            return
        await self._succeed(snap, result, claim, pod)
        if result.free_bytes is not None:
            await self._tell_cache(
                snap, spec, claim, needed=result.artifact.total_size, free=result.free_bytes
            )

    async def _claims(
        self, snap: EntitySnapshot, spec: ModelArtifactSpec, *, with_source: bool
    ) -> CacheClaim:
        """The claim the artifact is served from (the cache's, or a Direct source's),
        checking a Copy source's claim too when `with_source`. A missing claim fails
        the activity (StorageUnavailable)."""
        pvc = spec.source.persistent_volume_claim
        self._doing = "finding the claims"
        if is_direct(spec):
            assert pvc is not None
            return await self._claim(KubeActivities.source_claim, snap, pvc.claim_name)
        assert spec.cache_ref is not None  # the schema requires it for HF and Copy
        claim = await self._claim(KubeActivities.cache_claim, snap, spec.cache_ref.name)
        if pvc is not None and with_source:
            await self._claim(KubeActivities.source_claim, snap, pvc.claim_name)
        return claim

    def _importer(
        self,
        snap: EntitySnapshot,
        spec: ModelArtifactSpec,
        operation: str,
        *,
        with_token: bool,
        with_source: bool = True,
    ) -> ImporterPod:
        """The importer pod of one operation: the cache claim mounted (a Direct source
        has none), the source claim read-only, the token Secret when there is one. The
        activity reads which claims and Secret those are from the artifact itself."""
        return ImporterPod(
            ref=snap.ref,
            operation_id=operation,
            mount_cache=not is_direct(spec),
            mount_source=with_source and spec.source.persistent_volume_claim is not None,
            mount_token=with_token,
        )

    async def _start_verify(
        self, snap: EntitySnapshot, operation: str, request: VerifyInput
    ) -> workflow.ChildWorkflowHandle[VerifyWorkflow, VerifyResult]:
        return await workflow.start_child_workflow(
            VerifyWorkflow.run,
            request,
            id=verify_workflow_id(snap.ref, operation=operation),
            task_queue=workflow.info().task_queue,
            search_attributes=workflow.info().typed_search_attributes,
        )

    async def _watch(
        self,
        snap: EntitySnapshot,
        child: workflow.ChildWorkflowHandle[Any, Result],
        pod_request: ImporterPod,
        *,
        progress_of: str | None,
    ) -> Result:
        """Wait for a child on the importer's queue while an ImportWatchWorkflow mirrors
        the download progress of workflow `progress_of` into the status and keeps the
        importer pod; the child's result."""
        watch = await workflow.start_child_workflow(
            ImportWatchWorkflow.run,
            WatchInput(artifact=snap.ref, pod=pod_request, progress_of=progress_of),
            id=watch_workflow_id(child.id),
            task_queue=workflow.info().task_queue,
            search_attributes=workflow.info().typed_search_attributes,
        )
        try:
            return await child
        finally:  # the watch ends before the parent writes what the import ended in
            watch.cancel()
            with contextlib.suppress(ChildWorkflowError, asyncio.CancelledError):
                await watch

    async def _tell_cache(
        self,
        snap: EntitySnapshot,
        spec: ModelArtifactSpec,
        claim: CacheClaim,
        *,
        needed: int,
        free: int,
    ) -> None:
        """Send the cache's workflow what this import found on the volume (best effort:
        a cache whose workflow is gone has nobody to tell)."""
        if spec.cache_ref is None or not claim.owner_uid:
            return
        cache = ObjectRef(
            namespace=snap.ref.namespace,
            name=spec.cache_ref.name,
            uid=claim.owner_uid,
            cluster=snap.ref.cluster,
        )
        report = CapacityReport(artifact=snap.ref.name, needed_bytes=needed, free_bytes=free)
        try:
            await workflow.get_external_workflow_handle(cache_workflow_id(cache)).signal(
                CAPACITY_REPORT, report
            )
        except FailureError as exc:
            workflow.logger.info("cache %s not told about capacity: %s", cache.name, exc)

    # verify on request --------------------------------------------------------

    async def _verify(self, snap: EntitySnapshot) -> None:
        """Re-hash the published artifact (a `verify` signal): the cache blob against
        its manifest, or a Direct source in place against the manifest digest recorded
        at import. Bytes that differ make the artifact Failed (ChecksumMismatch) until
        `retry`; a re-hash that cannot run leaves it Ready and says why in an Event."""
        spec = ModelArtifactSpec.model_validate(snap.spec)
        self._memory.verifications += 1
        operation = f"{snap.ref.uid[:8]}-g{snap.generation}-v{self._memory.verifications}"
        recorded = (self._status.manifest_digest or "").removeprefix("sha256:")
        pvc = spec.source.persistent_volume_claim
        direct = is_direct(spec)
        try:
            claim = await self._claims(snap, spec, with_source=False)
        except ActivityError as exc:
            await self._verify_failed(snap, exc, pod=None)
            return
        pod_request = self._importer(snap, spec, operation, with_token=False, with_source=direct)
        self._doing = "verifying on request: starting the importer"
        pod = await call_kube(KubeActivities.ensure_importer_pod, pod_request)
        child = await self._start_verify(
            snap,
            operation,
            VerifyInput(
                importer_task_queue=importer_task_queue(snap.ref, operation=operation),
                pvc=PvcSource(
                    root=SOURCE_MOUNT, path=pvc.path, direct=True, entrypoint=spec.entrypoint
                )
                if direct and pvc is not None
                else None,
                cache_root="" if direct else CACHE_MOUNT,
                manifest_digest="" if direct else recorded,
                expected_sha256=spec.expected_sha256,
                expected_size=spec.expected_size,
            ),
        )
        self._doing = "verifying on request: re-hashing every file"
        try:
            verified = await self._watch(snap, child, pod_request, progress_of=None)
        except (ChildWorkflowError, ActivityError, ApplicationError) as exc:
            if not child.done():
                child.cancel()
            kind, message = failure_type(exc, default=Failure.VERIFY_FAILED)
            if kind != Failure.CHECKSUM_MISMATCH:
                await self._verify_failed(snap, exc, pod=pod)
                return
            await self._corrupted(snap, message, pod=pod)
            return
        found = verified.artifact
        if found is not None and found.manifest_digest != recorded:
            await self._corrupted(
                snap,
                f"the files on claim {claim.claim_name} changed since they were verified: "
                f"manifest digest {found.manifest_digest} != {recorded}",
                pod=pod,
            )
            return
        message = (
            f"re-hashed {verified.bytes_checked} bytes on request at {rfc3339(workflow.now())}"
        )
        await self._write(
            snap,
            ModelArtifactStatus(phase=ArtifactPhase.READY),
            conditions=[(ArtifactCondition.VERIFIED, True, ArtifactReason.REHASHED, message)],
        )
        await self._record(snap, type="Normal", reason=ArtifactReason.VERIFIED, message=message)
        await call_kube(KubeActivities.delete_pod, pod)
        self._doing = "ready (verified on request)"

    async def _corrupted(self, snap: EntitySnapshot, message: str, *, pod: PodRef) -> None:
        """A requested re-hash found other bytes: not servable until imported again."""
        await self._fail(snap, Failure.CHECKSUM_MISMATCH, message, pod=pod)
        self._memory.imported_generation = None

    async def _verify_failed(
        self, snap: EntitySnapshot, error: BaseException, *, pod: PodRef | None
    ) -> None:
        kind, message = failure_type(error, default=Failure.VERIFY_FAILED)
        self._last_error = f"verify: {kind}: {message}"
        await self._record(
            snap,
            type="Warning",
            reason=Failure.VERIFY_FAILED,
            message=f"the requested re-hash did not run ({kind}): {message}",
        )
        if pod is not None:
            await call_kube(KubeActivities.delete_pod, pod)

    async def _succeed(
        self, snap: EntitySnapshot, result: ImportResult, claim: CacheClaim, pod: PodRef
    ) -> None:
        published, conditions = published_status(result, claim)
        await self._write(snap, published, conditions=conditions)
        digest = f"sha256:{result.artifact.manifest_digest}"
        self._memory.imported_generation = snap.generation
        self._memory.failed_generation = None
        self._last_error = None
        await self._record(
            snap,
            type="Normal",
            reason=ArtifactReason.READY,
            message=f"Artifact {digest[:19]} is ready ({how_imported(result)})",
        )
        await call_kube(KubeActivities.delete_pod, pod)

    async def _fail(
        self, snap: EntitySnapshot, kind: str, message: str, *, pod: PodRef | None
    ) -> None:
        conditions = failure_conditions(kind, message)
        await self._write(
            snap, ModelArtifactStatus(phase=ArtifactPhase.FAILED), conditions=conditions
        )
        await self._record(snap, type="Warning", reason=kind, message=message)
        if pod is not None:
            await call_kube(KubeActivities.delete_pod, pod)
        self._memory.failed_generation = snap.generation
        self._last_error = f"{kind}: {message}"

    # deletion -----------------------------------------------------------------

    async def _finalize(self, snap: EntitySnapshot) -> None:
        polls = 0
        while True:
            if workflow.info().get_current_history_length() > HISTORY_LIMIT:
                workflow.continue_as_new(self._carried_over())  # finalizes again, at once
            self._doing = "deleting: checking for ModelDeployments that use the artifact"
            users = await call_kube(KubeActivities.artifact_users, snap.ref)
            if not users:
                break
            self._doing = f"deletion held: used by {', '.join(users)}"
            if users != self._memory.deletion_held_by:  # when who holds it changes
                await self._record(
                    snap,
                    type="Warning",
                    reason=ArtifactReason.DELETION_BLOCKED,
                    message=f"still used by ModelDeployment(s) {', '.join(users)}",
                )
                self._memory.deletion_held_by = users
            polls += 1
            pause = poll_interval(
                polls=polls, first=DELETE_RECHECK, maximum=DELETE_RECHECK_MAX, at_first_pace=1
            )
            await asyncio.sleep(pause.total_seconds())
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
        fields: ModelArtifactStatus,
        *,
        conditions: list[ConditionUpdate],
    ) -> None:
        """Set the fields set in `fields` (the phase, at least) and `conditions`; patch
        the status if that changed it."""
        status = updated_status_model(
            self._status,
            conditions,
            fields=[fields],
            now=workflow.now(),
            generation=snap.generation,
        )
        written = status_json(status)
        if await self._write_status(snap, written=self._memory.status, status=written):
            self._status, self._memory.status = status, written
