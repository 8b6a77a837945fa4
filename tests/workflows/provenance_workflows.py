"""The workflows of `test_workflow_provenance`: Kama's (a stand-in with Kama's type
name) and an attacker's, in a module of their own so the workflow sandbox imports
nothing but temporalio."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

ONCE = RetryPolicy(maximum_attempts=1)


async def write_status(*, what: str, queue: str) -> str:
    """Schedule `Write status` on `queue`, once, as each workflow here does."""
    result: str = await workflow.execute_activity(
        "Write status", what, task_queue=queue,
        start_to_close_timeout=timedelta(seconds=10), retry_policy=ONCE,
    )  # fmt: skip
    return result


@workflow.defn(name="Keep model deployment")
class KamasWorkflow:
    @workflow.run
    async def run(self, queue: str) -> str:
        return await write_status(what="kama's", queue=queue)


@workflow.defn(name="Keep model deployment")
class AttackersLookalike:
    """Kama's type name, run by the attacker's own worker on the attacker's queue."""

    @workflow.run
    async def run(self, queue: str) -> str:
        return await write_status(what="forged", queue=queue)


@workflow.defn(name="Forged task")
class AttackersOwn:
    @workflow.run
    async def run(self, queue: str) -> str:
        return await write_status(what="forged", queue=queue)
