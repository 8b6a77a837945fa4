"""A stored spec this version of Kama no longer accepts (written before a schema
change, or let in by an older admission) on the time-skipping server: the resource
says so in a condition naming the field, the workflow waits instead of failing its
task forever, a corrected spec goes on, and deletion is not held by it (#26 item 4)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from tests.workflows.scenarios import deployment_spec, staged, start_deployment
from tests.workflows.time_skipping import TimeSkippingServer


async def test_a_stored_spec_that_no_longer_validates(time_skipping: TimeSkippingServer) -> None:
    async with staged(time_skipping) as stage:
        bad = deployment_spec(replicas=1)
        bad["runtime"] = {"contextSize": -4096}
        deployment = await start_deployment(stage, "stale", bad)
        found = await stage.until(
            lambda: deployment.condition(stage, "RuntimeReady").get("reason") == "SpecInvalid",
            within=timedelta(minutes=1),
            what="RuntimeReady=False with reason SpecInvalid",
        )
        assert found
        message = deployment.condition(stage, "RuntimeReady")["message"]
        assert "spec.runtime.contextSize" in message, message
        assert not stage.cluster.called("Read artifact and nodes"), "nothing planned from it"
        await stage.skip(timedelta(minutes=30))
        history = await deployment.handle.fetch_history()
        failed = [e for e in history.events if e.HasField("workflow_task_failed_event_attributes")]
        assert not failed, "no workflow task failed on the stored spec"

        fixed = replace(deployment.snapshot, generation=2, spec=deployment_spec(replicas=1))
        await stage.cluster.change(deployment.handle.id, fixed)
        await stage.until(
            lambda: deployment.condition(stage, "RuntimeReady").get("status") == "True",
            within=timedelta(minutes=1),
            what="RuntimeReady=True once the spec is fixed",
        )

        broken_again = replace(fixed, generation=3, spec=bad)
        await stage.cluster.change(deployment.handle.id, broken_again)
        await stage.cluster.change(deployment.handle.id, replace(broken_again, deleting=True))
        await stage.result(deployment.handle)
        assert stage.cluster.called("Release finalizer"), "the deletion was not held"
