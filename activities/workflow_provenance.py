"""Only Kama's own workflows, run by Kama's worker, may schedule Kama's control
activities.

Anyone who reaches Kama's Temporal namespace (the gateway's credential, a cluster
sharing the namespace) can start a workflow of its own, on a task queue of its own,
that schedules `Write status`, `Record event` or `Create serving pod` on Kama's control
queue with inputs of its choosing: the activities re-derive what they act on from the
cluster, but a status or an Event is what a workflow decided, and nothing in the
cluster can say whether an attacker decided it. So before any activity runs, this
interceptor asks Temporal which workflow scheduled it (`describe` of the run the task
names: the server's word, not the task's) and runs it only if that workflow is one of
the worker's own types on the worker's own task queue, i.e. Kama's code, run by a Kama
worker. Anything else fails at once with the non-retryable `ForgedRequest`, naming
what did not match. One describe per workflow run (remembered for the last
`REMEMBERED_RUNS` runs); an activity that names no workflow is refused.

What this leaves (README, "Trust model"): a credential holder can still start Kama's
own workflow types on Kama's queue, or signal its running workflows, with inputs of
its choosing; those run Kama's code, which reads the cluster for what it acts on."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from activities.provenance import ForgedRequest

REMEMBERED_RUNS = 4096


class KamaWorkflowsOnly(Interceptor):
    """A worker interceptor: activities run only for the worker's own workflows."""

    def __init__(self, *, client: Client, task_queue: str, workflow_types: Collection[str]):
        self.client = client
        self.task_queue = task_queue
        self.workflow_types = frozenset(workflow_types)
        self._checked: OrderedDict[str, str | None] = OrderedDict()  # run id -> refusal

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _CheckedActivity(next, self)

    async def refusal(self, info: activity.Info) -> str | None:
        """Why the workflow that scheduled this task may not run it; None if it may."""
        if not info.workflow_id or not info.workflow_run_id:
            return f"activity {info.activity_type!r} was not scheduled by a workflow"
        if info.workflow_type not in self.workflow_types:
            return (
                f"activity {info.activity_type!r} was scheduled by workflow type "
                f"{info.workflow_type!r}, which is not one of Kama's"
            )
        run = info.workflow_run_id
        if run in self._checked:
            self._checked.move_to_end(run)
            return self._checked[run]
        try:
            described = await self.client.get_workflow_handle(
                info.workflow_id, run_id=run
            ).describe()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise  # Temporal could not answer now: the task is retried, not run
            return f"workflow {info.workflow_id!r} run {run!r} does not exist"
        found: str | None = None
        if described.task_queue != self.task_queue:
            found = (
                f"activity {info.activity_type!r} was scheduled by workflow "
                f"{info.workflow_id!r} on task queue {described.task_queue!r}, not on Kama's "
                f"{self.task_queue!r}"
            )
        elif described.workflow_type not in self.workflow_types:
            found = f"workflow {info.workflow_id!r} is of type {described.workflow_type!r}"
        self._checked[run] = found
        while len(self._checked) > REMEMBERED_RUNS:
            self._checked.popitem(last=False)
        return found


class _CheckedActivity(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, check: KamaWorkflowsOnly) -> None:
        super().__init__(next)
        self._check = check

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        refused = await self._check.refusal(activity.info())
        if refused is not None:
            activity.logger.warning("refused: %s", refused)
            raise ForgedRequest(refused)
        return await self.next.execute_activity(input)
