"""The `status` query of the workflows that serve one task rather than one resource
(Import, Verify, Rollout, Drain, Wake): they keep a `WorkflowStatus` up to date as
they go and answer with it. The entity workflows answer from their memory instead
(`EntityWorkflow._answer`); every answer has the same shape (`kama.contracts`)."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from kama.contracts import STATUS_QUERY, WorkflowStatus


class TaskStatus:
    """Mixed into a workflow class: `self._status`, answered by the `status` query."""

    def __init__(self) -> None:
        self._status = WorkflowStatus()

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> WorkflowStatus:
        return self._status
