"""A one-activity workflow for checking the Temporal dev server; kept in its own
module so the workflow sandbox imports nothing but temporalio."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

GREET_TIMEOUT = timedelta(seconds=30)


@activity.defn(name="Greet someone")
async def greet(name: str) -> str:
    return f"hello {name}"


@workflow.defn(name="Greeting")
class GreetingWorkflow:
    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(greet, name, start_to_close_timeout=GREET_TIMEOUT)
