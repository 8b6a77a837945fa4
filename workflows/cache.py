"""CacheWorkflow: the entity workflow of one ModelCache (`cache/<ns>/<name>/<uid>`).

It makes sure the storage exists (an existing claim is only looked at; a claim
template becomes a claim Kama creates), reports the bound claim, capacity and
access modes with `Ready` / `StorageUnavailable`, and on deletion waits until no
ModelArtifact uses the cache. Only then, and only with `retentionPolicy: Delete`
and a claim Kama created, the claim is deleted; an existing claim is never touched.

A grown `claimTemplate.size` expands the claim Kama created when its StorageClass
allows it (`Expand cache claim`; the workflow looks again until the volume has the
new size). `InsufficientCapacity` says when the cache is short of room: an import
reported (`capacity report` signal, with the free space it found) that it did not
fit, or the claim is smaller than the template asks and cannot grow (or is still
growing). The free space of the last report is in `freeBytes`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.calls import CallPolicy
from workflows.entity import EntityWorkflow, Rest
from workflows.kube_calls import CLAIM, CLAIM_RETRY, call_kube, failure_type

with workflow.unsafe.imports_passed_through():
    from activities.claims import (
        CLAIM_EXPANDING,
        CLAIM_NOT_EXPANDABLE,
        CLAIM_SIZED,
        CacheClaim,
        CacheRequest,
        ClaimExpansion,
    )
    from activities.kama_objects import FinalizerRequest
    from activities.kube import KubeActivities
    from kama.api import CacheConditionType, ModelCacheStatus
    from kama.conditions import (
        ConditionUpdate,
        status_json,
        updated_status_model,
        whole_seconds,
    )
    from kama.contracts import (
        CACHES,
        CAPACITY_REPORT,
        STATUS_QUERY,
        CapacityReport,
        EntitySnapshot,
        ObjectRef,
        WorkflowStatus,
        cache_workflow_id,
    )
    from kama.reasons import CacheReason, Failure

CLAIM_ATTEMPTS = 30  # then StorageUnavailable, and the workflow looks again after RECHECK
CLAIM_CHECK = CallPolicy(
    timeout=CLAIM.timeout,
    retry=dataclasses.replace(CLAIM_RETRY, maximum_attempts=CLAIM_ATTEMPTS),
)
RECHECK = timedelta(seconds=30)


def capacity_condition(
    *, expansion: ClaimExpansion | None, report: CapacityReport | None
) -> ConditionUpdate | None:
    """InsufficientCapacity from the last import's report and the claim's size: an
    import that did not fit first (an artifact is failing for it), then a claim
    smaller than the template asks. None while neither is known."""
    kind = CacheConditionType.INSUFFICIENT_CAPACITY
    if report is not None and report.short:
        return (
            kind,
            True,
            CacheReason.IMPORT_DOES_NOT_FIT,
            f"ModelArtifact {report.artifact} needs {report.needed_bytes} bytes, the cache "
            f"had {report.free_bytes} free: grow spec.claimTemplate.size (or the claim), or "
            "free space, then `retry` the artifact",
        )
    if expansion is not None and expansion.state != CLAIM_SIZED:
        return (kind, True, expansion.state, expansion.message)
    if report is not None:
        message = (
            f"ModelArtifact {report.artifact} fit: {report.needed_bytes} of "
            f"{report.free_bytes} free bytes"
        )
        return (kind, False, CacheReason.ENOUGH, message)
    if expansion is not None:
        return (kind, False, CacheReason.ENOUGH, expansion.message)
    return None


@dataclass(frozen=True)
class CacheInput:
    snapshot: EntitySnapshot  # same shape: identity, generation, spec, deleting
    status: dict[str, Any] = field(default_factory=dict)  # as last written (`status_json`)
    report: CapacityReport | None = None  # the last import's capacity report


@dataclass
class CacheWorkflowStatus(WorkflowStatus):
    """The `status` answer of a CacheWorkflow."""

    claim: str | None = None
    conditions: list[dict[str, Any]] = field(default_factory=list)


@workflow.defn(name="Keep model cache")
class CacheWorkflow(EntityWorkflow):
    plural = CACHES
    kind = "ModelCache"

    @staticmethod
    def workflow_id_for(ref: ObjectRef) -> str:
        return cache_workflow_id(ref)

    @staticmethod
    def carries_memory(request: CacheInput) -> bool:
        return bool(request.status) or request.report is not None

    def __init__(self) -> None:
        super().__init__()
        self._status = ModelCacheStatus()
        self._last_report: CapacityReport | None = None
        self._reported: ModelCacheStatus | None = None  # a report's fields not written yet

    @workflow.signal(name=CAPACITY_REPORT)
    def capacity_report(self, report: CapacityReport) -> None:
        """An import found `free_bytes` on the volume and needed `needed_bytes`."""
        self._last_report = report
        left = report.free_bytes if report.short else report.free_bytes - report.needed_bytes
        self._reported = ModelCacheStatus(
            free_bytes=left, free_reported_at=whole_seconds(workflow.now())
        )

    def _woken(self, snap: EntitySnapshot) -> bool:
        return self._reported is not None or super()._woken(snap)

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> CacheWorkflowStatus:
        return self._answer(
            CacheWorkflowStatus(
                claim=self._status.claim_name,
                conditions=list(status_json(self._status).get("conditions", [])),
            )
        )

    @workflow.run
    async def run(self, request: CacheInput) -> None:
        self._status = ModelCacheStatus.model_validate(request.status)
        self._last_report = request.report
        await self._keep(request.snapshot)

    async def _reconcile(self, snap: EntitySnapshot, *, retry: bool) -> Rest:
        reported, self._reported = self._reported, None
        claim = await self._find_claim(snap)
        if claim is None:
            self._doing = "waiting for storage"
            return Rest(timeout=RECHECK)
        expansion = await self._expansion(snap)
        capacity = capacity_condition(expansion=expansion, report=self._last_report)
        bound = ModelCacheStatus(
            claim_name=claim.claim_name, capacity=claim.capacity, access_modes=claim.access_modes
        )
        await self._write(
            snap,
            [bound] if reported is None else [bound, reported],
            ready=True,
            reason=CacheReason.CLAIM_BOUND,
            message=f"claim {claim.claim_name} is bound ({claim.capacity})",
            extra=[] if capacity is None else [capacity],
        )
        if expansion is not None and expansion.state == CLAIM_EXPANDING:
            self._doing = f"ready; {expansion.message}"
            return Rest(timeout=RECHECK)
        self._doing = "ready"
        return Rest()

    def _carried_over(self) -> CacheInput:
        assert self._snapshot is not None
        return CacheInput(
            snapshot=self._snapshot, status=status_json(self._status), report=self._last_report
        )

    async def _find_claim(self, snap: EntitySnapshot) -> CacheClaim | None:
        """The bound claim, or None (reported as StorageUnavailable)."""
        self._doing = "finding the claim"
        try:
            return await CLAIM_CHECK.schedule(
                KubeActivities.cache_claim,
                CacheRequest(namespace=snap.ref.namespace, name=snap.ref.name),
            )
        except ActivityError as exc:
            kind, message = failure_type(exc, default=Failure.STORAGE_UNAVAILABLE)
            await self._report(snap, reason=kind, message=message)
            return None

    async def _expansion(self, snap: EntitySnapshot) -> ClaimExpansion | None:
        """Size the claim Kama created to the template (None for an existing claim)."""
        if "claimTemplate" not in snap.spec:
            return None
        self._doing = "sizing the claim"
        try:
            return await CLAIM_CHECK.schedule(
                KubeActivities.expand_cache_claim,
                CacheRequest(namespace=snap.ref.namespace, name=snap.ref.name),
            )
        except ActivityError as exc:
            kind, message = failure_type(exc, default=Failure.EXPANSION_FAILED)
            return ClaimExpansion(state=CLAIM_NOT_EXPANDABLE, message=f"{kind}: {message}")

    async def _report(self, snap: EntitySnapshot, *, reason: str, message: str) -> None:
        await self._write(snap, [], ready=False, reason=reason, message=message)

    async def _finalize(self, snap: EntitySnapshot) -> None:
        while True:
            users = await call_kube(KubeActivities.cache_users, snap.ref)
            if not users:
                break
            self._doing = f"deletion held: used by ModelArtifact(s) {', '.join(users)}"
            await self._record(
                snap, type="Warning", reason=CacheReason.DELETION_BLOCKED, message=self._doing
            )
            await workflow.sleep(RECHECK)
        if snap.spec.get("retentionPolicy") == "Delete" and "claimTemplate" in snap.spec:
            self._doing = "deleting the claim Kama created"
            await call_kube(
                KubeActivities.delete_cache_claim,
                CacheRequest(namespace=snap.ref.namespace, name=snap.ref.name),
            )
        await call_kube(
            KubeActivities.release_finalizer, FinalizerRequest(plural=CACHES, ref=snap.ref)
        )
        self._doing = "deleted"

    async def _write(
        self,
        snap: EntitySnapshot,
        fields: list[ModelCacheStatus],
        *,
        ready: bool,
        reason: str,
        message: str,
        extra: list[ConditionUpdate] | None = None,
    ) -> None:
        status = updated_status_model(
            self._status,
            [
                (CacheConditionType.READY, ready, reason, message),
                (
                    CacheConditionType.STORAGE_UNAVAILABLE,
                    not ready,
                    reason,
                    "" if ready else message,
                ),
                *(extra or []),
            ],
            fields=fields,
            now=workflow.now(),
            generation=snap.generation,
        )
        if await self._write_status(
            snap, written=status_json(self._status), status=status_json(status)
        ):
            self._status = status
