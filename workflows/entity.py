"""The shape of an entity workflow: one per Kama resource (`<kind>/<ns>/<name>/<uid>`),
shared by ArtifactWorkflow, CacheWorkflow and DeploymentWorkflow.

The watcher starts it with a snapshot of the resource and signals `spec changed` with
each newer one. A snapshot is only a hint: anyone with a Temporal client can start an
entity workflow or signal one, so before a pass acts on a snapshot it has not seen, the
workflow reads its resource from the API server (`Read Kama object`) and takes the
generation, spec and deletion from there (and one started under another ID than the
watcher's for its resource, or freshly started with memory, never runs:
`workflows.entity_identity`). The loop is the same for all three: take
the newest snapshot, confirmed; when it is being deleted, finalize and end; otherwise make one pass, then rest until
something asks for another (a newer snapshot, a `retry` signal, the workflow's own
signals or timer), and continue as new once the history is long.

A pass that meets an error no retry can fix (the API server answered 403 or 422, a
child failed for good) does not fail the workflow and is not retried on a timer: it
is reported on the resource (a condition naming the object and the permission) and
the loop waits for a spec change or a `retry` signal, the two ways a person says
"fixed, try again". A stored spec this version of Kama no longer accepts (written
before a schema change, or past an older admission) is such an error too: reason
`SpecInvalid`, the message naming each field, never a workflow task failing forever.

Every entity also writes its status and Events the same way (`_write_status`,
`_record`), and answers `status` with a `WorkflowStatus` filled by `_answer`.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

from workflows.kube_calls import call_kube, failure_type

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from activities.kama_objects import ObjectRead
    from activities.kube import EventRequest, KubeActivities, StatusPatch
    from kama.api.meta import WORKFLOW_ID_FIELD
    from kama.contracts import RETRY, SPEC_CHANGED, EntitySnapshot, ObjectRef, WorkflowStatus
    from kama.validation_problems import describe_problems

HISTORY_LIMIT = 2000
"""Events in one run of an entity workflow before it continues as new."""

Status = TypeVar("Status", bound=WorkflowStatus)


SPEC_INVALID = "SpecInvalid"
SPEC_PROBLEMS_SHOWN = 4


def spec_invalid(error: ValidationError) -> ApplicationError:
    """A stored spec that does not validate, as the typed error `_blocked` reports:
    `spec.<field>: <why>` for each of the first few problems."""
    message = describe_problems(error, prefix="spec.", shown=SPEC_PROBLEMS_SHOWN)
    return ApplicationError(
        f"the stored spec does not validate: {message}", type=SPEC_INVALID, non_retryable=True
    )


@dataclass(frozen=True)
class Rest:
    """How an entity waits after a pass: until it is woken, or `timeout` at the most."""

    timeout: timedelta | None = None


AGAIN = None
"""What a pass returns to have the next pass start at once."""


class EntityWorkflow(ABC):
    """The loop, signals and status shared by the entity workflows; each subclass
    says what one pass does, how it finalizes, and how it reports a blocked pass."""

    plural: ClassVar[str]  # its resource, for status writes (`modelartifacts`)
    kind: ClassVar[str]  # its kind, for Events (`ModelArtifact`)

    def __init__(self) -> None:
        self._snapshot: EntitySnapshot | None = None
        self._confirmed: EntitySnapshot | None = None  # the last one read from the API server
        self._retry = False
        self._doing = "starting"
        self._blocked_by: str | None = None

    # signals ------------------------------------------------------------------

    @workflow.signal(name=SPEC_CHANGED)
    def spec_changed(self, snapshot: EntitySnapshot) -> None:
        previous = self._snapshot
        if previous is not None and snapshot.ref != previous.ref:
            return  # about another object: not this workflow's
        if snapshot.supersedes(previous):
            self._snapshot = snapshot
            self._took(snapshot, previous=previous)

    @workflow.signal(name=RETRY)
    def retry(self) -> None:
        """Someone fixed what stopped the last pass (a token, a permission): go again."""
        self._retry = True

    def _took(self, snapshot: EntitySnapshot, *, previous: EntitySnapshot | None) -> None:
        """A newer snapshot arrived (it is already `self._snapshot`); nothing more by
        default."""
        return None

    # the loop -----------------------------------------------------------------

    async def _keep(self, first: EntitySnapshot) -> None:
        """Run the entity until its resource is deleted and finalized."""
        current = self._snapshot
        if current is None or current.ref != first.ref or current.generation < first.generation:
            self._snapshot = first
        while True:
            snap = self._snapshot
            assert snap is not None
            retry, self._retry = self._retry, False
            try:
                snap = await self._confirm(first.ref)
                if snap.deleting:
                    await self._finalize(snap)
                    return
                rest = await self._reconcile(snap, retry=retry)
                self._blocked_by = None
                woken = self._woken_after(snap)
            except (ActivityError, ChildWorkflowError) as error:
                await self._blocked(snap, error)
                rest, woken = Rest(), self._changed_or_retried(snap)
            except ValidationError as error:
                await self._blocked(snap, spec_invalid(error))
                rest, woken = Rest(), self._changed_or_retried(snap)
            if rest is None:  # AGAIN
                continue
            try:
                await workflow.wait_condition(woken, timeout=rest.timeout)
            except TimeoutError:
                self._rested()
            if workflow.info().get_current_history_length() > HISTORY_LIMIT:
                workflow.continue_as_new(self._carried_over())

    async def _confirm(self, ref: ObjectRef) -> EntitySnapshot:
        """The newest snapshot, its generation, spec and deletion as the API server has
        them for `ref` (the workflow's own resource, whatever a signal named); read
        once per snapshot taken."""
        taken = self._snapshot
        assert taken is not None
        if taken is self._confirmed:
            return taken
        live = await call_kube(KubeActivities.read_object, ObjectRead(plural=self.plural, ref=ref))
        confirmed = live.confirm(replace(self._confirmed or taken, ref=ref))
        if self._snapshot is taken:  # no newer one came while reading
            self._snapshot = confirmed
        self._confirmed = confirmed
        return confirmed

    @staticmethod
    @abstractmethod
    def workflow_id_for(ref: ObjectRef) -> str:
        """The ID the watcher gives this entity's workflow for `ref`."""

    @staticmethod
    @abstractmethod
    def carries_memory(request: Any) -> bool:
        """Whether `request` (the workflow's input) carries more than the watcher
        starts it with: only a run continued as new may."""

    @classmethod
    def start_refusal(cls, request: Any) -> str | None:
        """Why this start is not one the watcher (or the workflow itself, continuing
        as new) makes; None when it is (`workflows.entity_identity`)."""
        ref: ObjectRef = request.snapshot.ref
        own, started = cls.workflow_id_for(ref), workflow.info().workflow_id
        if started != own:
            return (
                f"workflow {started!r} is not the one for {cls.kind} "
                f"{ref.namespace}/{ref.name} ({own!r})"
            )
        if workflow.info().continued_run_id is None and cls.carries_memory(request):
            return f"a fresh start of {own!r} carries memory that only a continued run has"
        return None

    @abstractmethod
    async def _reconcile(self, snap: EntitySnapshot, *, retry: bool) -> Rest | None:
        """One pass towards `snap` (`retry`: a `retry` signal came since the last
        pass); how to rest after it, or AGAIN."""

    @abstractmethod
    async def _finalize(self, snap: EntitySnapshot) -> None:
        """The resource is being deleted: clean up and release its finalizer."""

    @abstractmethod
    async def _report(self, snap: EntitySnapshot, *, reason: str, message: str) -> None:
        """Tell the user (conditions, an Event) why the last pass stopped."""

    @abstractmethod
    def _carried_over(self) -> object:
        """The input of the next run, when continuing as new."""

    def _woken(self, snap: EntitySnapshot) -> bool:
        """Whether to start another pass after one for `snap`: by default when a newer
        generation arrived or the resource is being deleted."""
        current = self._snapshot
        return current is not None and (current.deleting or current.generation != snap.generation)

    def _rested(self) -> None:
        """The rest timed out without anything waking the workflow; nothing by default."""
        return None

    def _woken_after(self, snap: EntitySnapshot) -> Callable[[], bool]:
        return lambda: self._retry or self._woken(snap)

    def _changed_or_retried(self, snap: EntitySnapshot) -> Callable[[], bool]:
        return lambda: self._retry or self._snapshot is not snap

    async def _blocked(self, snap: EntitySnapshot, error: BaseException) -> None:
        """A pass failed for good: report it (if the report itself fails, the query
        still says why) and wait for a person."""
        reason, message = failure_type(error, default="Failed")
        self._blocked_by = f"{reason}: {message}"
        self._doing = f"stopped ({reason}): waiting for a spec change or a `retry` signal"
        with contextlib.suppress(ActivityError, ChildWorkflowError):
            await self._report(snap, reason=reason, message=message)

    # status, Events and the query ---------------------------------------------

    async def _write_status(
        self, snap: EntitySnapshot, *, written: Mapping[str, Any], status: dict[str, Any]
    ) -> bool:
        """Patch the resource's status with `status` unless that is what was last
        `written`; whether it wrote. Every write also names this workflow
        (`status.workflowID`), so `kubectl get -o wide` leads to it in Temporal; that
        changes the activity's input only, no command, so recorded histories replay."""
        if status == written:
            return False
        named = {**status, WORKFLOW_ID_FIELD: workflow.info().workflow_id}
        await call_kube(
            KubeActivities.patch_status,
            StatusPatch(kind_plural=self.plural, ref=snap.ref, status=named),
        )
        return True

    def _event(self, snap: EntitySnapshot, *, type: str, reason: str, message: str) -> EventRequest:
        """An Event about the resource (`type`: Normal or Warning)."""
        return EventRequest(
            kind=self.kind, ref=snap.ref, type=type, reason=reason, message=message[:1024]
        )

    async def _record(self, snap: EntitySnapshot, *, type: str, reason: str, message: str) -> None:
        """Record an Event about the resource."""
        await call_kube(
            KubeActivities.record_event,
            self._event(snap, type=type, reason=reason, message=message),
        )

    def _answer(self, status: Status) -> Status:
        """`status` (the workflow's own facts) completed with what every entity knows."""
        status.doing = self._doing
        status.generation = self._snapshot.generation if self._snapshot else None
        status.last_error = self._blocked_by or status.last_error
        return status
