"""CacheWorkflow: the entity workflow of one ModelCache (`cache/<ns>/<name>/<uid>`).

It makes sure the storage exists (an existing claim is only looked at; a claim
template becomes a claim Kama creates), reports the bound claim, capacity and
access modes with `Ready` / `StorageUnavailable`, and on deletion waits until no
ModelArtifact uses the cache. Only then, and only with `retentionPolicy: Delete`
and a claim Kama created, the claim is deleted; an existing claim is never touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

from workflows.kube_calls import KUBE_TIMEOUT, call_kube

with workflow.unsafe.imports_passed_through():
    from activities.kube import (
        CacheClaim,
        CacheRequest,
        EventRequest,
        FinalizerRequest,
        KubeActivities,
        StatusPatch,
    )
    from kama.api import CacheConditionType
    from kama.conditions import set_condition
    from kama.contracts import CACHES, SPEC_CHANGED, EntitySnapshot, ObjectRef
    from workflows.artifact import failure_type

CLAIM_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=30,
    non_retryable_error_types=["StorageUnavailable"],
)
RECHECK = timedelta(seconds=30)
HISTORY_LIMIT = 2000


@dataclass(frozen=True)
class CacheInput:
    snapshot: EntitySnapshot  # same shape: identity, generation, spec, deleting
    status: dict[str, Any] = field(default_factory=dict)


@workflow.defn(name="Keep model cache")
class CacheWorkflow:
    def __init__(self) -> None:
        self._snapshot: EntitySnapshot | None = None
        self._status: dict[str, Any] = {}
        self._doing = "starting"

    @workflow.signal(name=SPEC_CHANGED)
    def spec_changed(self, snapshot: EntitySnapshot) -> None:
        if snapshot.supersedes(self._snapshot):
            self._snapshot = snapshot

    @workflow.query(name="status")
    def status(self) -> dict[str, Any]:
        return {
            "doing": self._doing,
            "claim": self._status.get("claimName"),
            "conditions": self._status.get("conditions", []),
        }

    @workflow.run
    async def run(self, request: CacheInput) -> None:
        if self._snapshot is None or self._snapshot.generation < request.snapshot.generation:
            self._snapshot = request.snapshot
        self._status = dict(request.status)
        while True:
            snap = self._snapshot
            assert snap is not None
            if snap.deleting:
                await self._finalize(snap)
                return
            ready = await self._reconcile(snap)
            self._doing = "ready" if ready else "waiting for storage"
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    self._changed_since(snap.generation), timeout=None if ready else RECHECK
                )
            if workflow.info().get_current_history_length() > HISTORY_LIMIT:
                workflow.continue_as_new(CacheInput(snapshot=self._snapshot, status=self._status))

    def _changed_since(self, generation: int) -> Callable[[], bool]:
        def check() -> bool:
            snap = self._snapshot
            return snap is not None and (snap.deleting or snap.generation != generation)

        return check

    async def _reconcile(self, snap: EntitySnapshot) -> bool:
        self._doing = "finding the claim"
        try:
            claim: CacheClaim = await workflow.execute_activity_method(
                KubeActivities.cache_claim,
                CacheRequest(namespace=snap.ref.namespace, name=snap.ref.name),
                start_to_close_timeout=KUBE_TIMEOUT,
                retry_policy=CLAIM_RETRY,
            )
        except Exception as exc:
            kind, message = failure_type(exc)
            await self._write(snap, {}, ready=False, reason=kind, message=message)
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

    async def _finalize(self, snap: EntitySnapshot) -> None:
        while True:
            users: list[str] = await self._kube(KubeActivities.cache_users, snap.ref)
            if not users:
                break
            self._doing = f"deletion held: used by ModelArtifact(s) {', '.join(users)}"
            await self._kube(
                KubeActivities.record_event,
                EventRequest(
                    kind="ModelCache",
                    ref=snap.ref,
                    type="Warning",
                    reason="DeletionBlocked",
                    message=self._doing,
                ),
            )
            await workflow.sleep(RECHECK)
        if snap.spec.get("retentionPolicy") == "Delete" and "claimTemplate" in snap.spec:
            self._doing = "deleting the claim Kama created"
            await self._kube(
                KubeActivities.delete_cache_claim,
                CacheRequest(namespace=snap.ref.namespace, name=snap.ref.name),
            )
        await self._kube(
            KubeActivities.release_finalizer, FinalizerRequest(plural=CACHES, ref=snap.ref)
        )
        self._doing = "deleted"

    async def _kube(self, method: Any, argument: Any) -> Any:
        return await call_kube(method, argument)

    async def _write(
        self,
        snap: EntitySnapshot,
        fields: dict[str, Any],
        *,
        ready: bool,
        reason: str,
        message: str,
    ) -> None:
        status = {**self._status, **fields, "observedGeneration": snap.generation}
        conditions = list(status.get("conditions", []))
        now = workflow.now()
        conditions = set_condition(
            conditions,
            type=CacheConditionType.READY,
            status=ready,
            reason=reason,
            message=message,
            now=now,
            generation=snap.generation,
        )
        conditions = set_condition(
            conditions,
            type=CacheConditionType.STORAGE_UNAVAILABLE,
            status=not ready,
            reason=reason,
            message="" if ready else message,
            now=now,
            generation=snap.generation,
        )
        status["conditions"] = conditions
        if status == self._status:
            return
        self._status = status
        await self._kube(
            KubeActivities.patch_status,
            StatusPatch(kind_plural=CACHES, ref=ObjectRef(**vars(snap.ref)), status=status),
        )
