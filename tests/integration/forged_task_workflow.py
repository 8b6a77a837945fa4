"""What an attacker who reaches Kama's Temporal namespace can do without any
Kubernetes right: start a workflow of its own that schedules one of Kama's activities
on Kama's control queue with an input of its choosing. Kept in its own module so the
workflow sandbox imports nothing but temporalio."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

FORGED_TIMEOUT = timedelta(seconds=30)


@dataclass(frozen=True)
class ForgedTask:
    activity: str
    argument: dict[str, Any]
    task_queue: str


@workflow.defn(name="Forged task")
class ForgedTaskWorkflow:
    @workflow.run
    async def run(self, task: ForgedTask) -> Any:
        return await workflow.execute_activity(
            task.activity,
            task.argument,
            task_queue=task.task_queue,
            start_to_close_timeout=FORGED_TIMEOUT,
            retry_policy=RetryPolicy(maximum_attempts=1),
        )
