"""A Kama workflow runs only when it was started the way Kama starts it.

Anyone who reaches Kama's Temporal namespace can start Kama's workflow types on Kama's
queue under IDs and with inputs of their choosing: `Keep model deployment` under a
new ID with a snapshot naming another tenant's resource, the same under the real ID
(after terminating the real run) with a forged `memory` (a serving template of their
own), or `Roll out model deployment` with a template copied from a history and
edited. Kama's code would then act on those inputs with the worker's rights. So
before a workflow's code runs, this interceptor asks the workflow class whether its
start is one Kama makes (`start_refusal`: the entity workflows' ID is the one the
watcher gives their resource and a fresh start carries no memory, a rollout's parent
is its deployment's workflow) and fails the workflow at once, non-retryably, with
the class's reason when it is not.

A worker interceptor rather than a line in each workflow: committed histories replay
under their file names as IDs and without parents (`tests/workflows/test_replay.py`),
and refusing a start is a decision the worker makes about who started the workflow,
not a step of the workflow itself."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

with workflow.unsafe.imports_passed_through():
    from kama.reasons import Failure

START_REFUSAL = "start_refusal"
"""The static method a workflow class answers with why its start (its input, and
`workflow.info()`) is not one Kama makes; None when it is."""


class StartedByKama(Interceptor):
    """A worker interceptor: Kama's workflows run only as Kama starts them."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _StartCheck


class _StartCheck(WorkflowInboundInterceptor):
    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        # looked up by name: the sandbox imports the workflow classes anew
        refusal = getattr(input.type, START_REFUSAL, None)
        if callable(refusal) and input.args:
            why = refusal(input.args[0])
            if why is not None:
                raise ApplicationError(why, type=Failure.FORGED_REQUEST, non_retryable=True)
        return await super().execute_workflow(input)
