"""CacheWorkflow: the entity workflow of one ModelCache (`cache/<ns>/<name>/<uid>`).

It makes sure the storage exists (an existing claim is only looked at; a claim
template becomes a claim Kama creates), reports the bound claim, capacity and
access modes with `Ready` / `StorageUnavailable`, and on deletion waits until no
ModelArtifact uses the cache. Only then, and only with `retentionPolicy: Delete`
and a claim Kama created, the claim is deleted; an existing claim is never touched.
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
    from activities.kube import CacheRequest, FinalizerRequest, KubeActivities
    from kama.api import CacheConditionType
    from kama.conditions import updated_status
    from kama.contracts import CACHES, STATUS_QUERY, EntitySnapshot, WorkflowStatus

CLAIM_ATTEMPTS = 30  # then StorageUnavailable, and the workflow looks again after RECHECK
CLAIM_CHECK = CallPolicy(
    timeout=CLAIM.timeout,
    retry=dataclasses.replace(CLAIM_RETRY, maximum_attempts=CLAIM_ATTEMPTS),
)
RECHECK = timedelta(seconds=30)


@dataclass(frozen=True)
class CacheInput:
    snapshot: EntitySnapshot  # same shape: identity, generation, spec, deleting
    status: dict[str, Any] = field(default_factory=dict)


@dataclass
class CacheWorkflowStatus(WorkflowStatus):
    """The `status` answer of a CacheWorkflow."""

    claim: str | None = None
    conditions: list[dict[str, Any]] = field(default_factory=list)


@workflow.defn(name="Keep model cache")
class CacheWorkflow(EntityWorkflow):
    plural = CACHES
    kind = "ModelCache"

    def __init__(self) -> None:
        super().__init__()
        self._status: dict[str, Any] = {}

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> CacheWorkflowStatus:
        return self._answer(
            CacheWorkflowStatus(
                claim=self._status.get("claimName"),
                conditions=list(self._status.get("conditions", [])),
            )
        )

    @workflow.run
    async def run(self, request: CacheInput) -> None:
        self._status = dict(request.status)
        await self._keep(request.snapshot)

    async def _reconcile(self, snap: EntitySnapshot, *, retry: bool) -> Rest:
        ready = await self._find_claim(snap)
        self._doing = "ready" if ready else "waiting for storage"
        return Rest(timeout=None if ready else RECHECK)

    def _carried_over(self) -> CacheInput:
        assert self._snapshot is not None
        return CacheInput(snapshot=self._snapshot, status=self._status)

    async def _find_claim(self, snap: EntitySnapshot) -> bool:
        self._doing = "finding the claim"
        try:
            claim = await CLAIM_CHECK.schedule(
                KubeActivities.cache_claim,
                CacheRequest(namespace=snap.ref.namespace, name=snap.ref.name),
            )
        except ActivityError as exc:
            kind, message = failure_type(exc, default="StorageUnavailable")
            await self._report(snap, reason=kind, message=message)
            return False
        fields = {
            "claimName": claim.claim_name,
            "capacity": claim.capacity,
            "accessModes": claim.access_modes,
        }
        await self._write(
            snap,
            fields,
            ready=True,
            reason="ClaimBound",
            message=f"claim {claim.claim_name} is bound ({claim.capacity})",
        )
        return True

    async def _report(self, snap: EntitySnapshot, *, reason: str, message: str) -> None:
        await self._write(snap, {}, ready=False, reason=reason, message=message)

    async def _finalize(self, snap: EntitySnapshot) -> None:
        while True:
            users = await call_kube(KubeActivities.cache_users, snap.ref)
            if not users:
                break
            self._doing = f"deletion held: used by ModelArtifact(s) {', '.join(users)}"
            await self._record(snap, type="Warning", reason="DeletionBlocked", message=self._doing)
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
        fields: dict[str, Any],
        *,
        ready: bool,
        reason: str,
        message: str,
    ) -> None:
        status = updated_status(
            self._status,
            [
                (CacheConditionType.READY, ready, reason, message),
                (
                    CacheConditionType.STORAGE_UNAVAILABLE,
                    not ready,
                    reason,
                    "" if ready else message,
                ),
            ],
            fields=fields,
            now=workflow.now(),
            generation=snap.generation,
        )
        if await self._write_status(snap, written=self._status, status=status):
            self._status = status
