"""A Temporal credential cannot tell an entity workflow what its resource says
(issue #41 item 7), on the time-skipping server.

Anyone who reaches Kama's Temporal namespace can signal `spec changed` to a running
entity workflow (its ID is in Temporal's list) with a snapshot of their choosing, or
start one of Kama's entity workflow types under an ID of their choosing. Before the
fix the deployment's workflow took the signal's spec as the resource's: a forged
`replicas: 6` had six serving pods created in the tenant's namespace, and a forged
`deleting` tore the deployment's pods down and released its finalizer. Now the
snapshot is only a hint: the workflow reads its resource from the API server
(`Read Kama object`) and acts on that."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError

from kama.contracts import SPEC_CHANGED, EntitySnapshot
from kama.reasons import Failure
from tests.workflows.scenarios import (
    deployment_spec,
    new_ref,
    serving_deployment,
    staged,
)
from tests.workflows.time_skipping import TimeSkippingServer
from workflows.deployment import DeploymentInput, DeploymentMemory, DeploymentWorkflow
from workflows.rollout import RolloutInput, RolloutWorkflow


async def test_a_forged_spec_changed_signal_changes_nothing(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        deployment = await serving_deployment(stage, "victim")
        pods = set(stage.cluster.pods)
        stage.cluster.calls.clear()

        forged = replace(deployment.snapshot, generation=99, spec=deployment_spec(replicas=6))
        await deployment.handle.signal(SPEC_CHANGED, forged)
        await deployment.handle.signal(SPEC_CHANGED, replace(forged, generation=100, deleting=True))
        await stage.skip(timedelta(minutes=5))

        assert not stage.cluster.called("Create serving pod"), "no pod for a forged spec"
        assert not stage.cluster.called("Set deployment replicas")
        assert not stage.cluster.called("Delete serving pod"), "no teardown for a forged delete"
        assert not stage.cluster.called("Release finalizer")
        assert set(stage.cluster.pods) == pods
        assert stage.cluster.called("Read Kama object"), "the workflow read its resource"
        described = await deployment.handle.describe()
        assert described.status is not None and described.status.name == "RUNNING"

        # a real change after the forgery is still taken: the forged generation
        # does not hide the next genuine one
        await stage.cluster.change(
            deployment.handle.id, replace(deployment.snapshot, generation=2, deleting=True)
        )
        await stage.result(deployment.handle)
        assert stage.cluster.called("Release finalizer")


async def test_a_signal_naming_another_object_is_not_read_or_acted_on(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        deployment = await serving_deployment(stage, "mine")
        stage.cluster.calls.clear()
        other = EntitySnapshot(
            ref=new_ref("theirs"), generation=7, spec=deployment_spec(replicas=3), deleting=True
        )
        await deployment.handle.signal(SPEC_CHANGED, other)
        await stage.skip(timedelta(minutes=5))
        touched = {c.argument.ref.name for c in stage.cluster.calls if hasattr(c.argument, "ref")}
        assert "theirs" not in touched, touched
        assert not stage.cluster.called("Release finalizer")


async def test_an_entity_workflow_started_under_another_id_fails_before_acting(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        victim = new_ref("victim")
        snapshot = EntitySnapshot(ref=victim, generation=1, spec=deployment_spec(replicas=4))
        handle = await stage.client.start_workflow(
            DeploymentWorkflow.run,
            DeploymentInput(snapshot=snapshot),
            id="attackers-own-deployment",
            task_queue=stage.task_queue,
        )
        try:
            await stage.result(handle)
        except WorkflowFailureError as failure:
            cause = failure.cause
            assert isinstance(cause, ApplicationError), cause
            assert cause.type == Failure.FORGED_REQUEST, cause
            assert "deployment/" in str(cause) and victim.uid in str(cause), cause
        else:
            raise AssertionError("the forged workflow ran to its end")
        assert not stage.cluster.calls, [c.name for c in stage.cluster.calls]


async def test_a_fresh_start_with_memory_and_a_rollout_without_its_parent_are_refused(
    time_skipping: TimeSkippingServer,
) -> None:
    """After terminating a deployment's workflow, an attacker could start it again
    under its real ID with memory of their choosing (a serving template), or start a
    rollout of it with a template copied from its history and edited (more CPU and
    memory): neither runs."""
    async with staged(time_skipping) as stage:
        deployment = await serving_deployment(stage, "victim")
        (created,) = stage.cluster.called("Create serving pod")
        await deployment.handle.terminate("the attacker's")
        stage.cluster.calls.clear()

        greedy = replace(created.template, cpu_request="15", memory_request="60Gi")
        forged_memory = DeploymentMemory(template=greedy)
        again = await stage.client.start_workflow(
            DeploymentWorkflow.run,
            DeploymentInput(snapshot=deployment.snapshot, memory=forged_memory),
            id=deployment.handle.id,
            task_queue=stage.task_queue,
        )
        rollout = await stage.client.start_workflow(
            RolloutWorkflow.run,
            RolloutInput(
                ref=deployment.ref, template=greedy, desired=3, next_ordinal=1, deadline_s=60
            ),
            id=f"rollout-of-{deployment.ref.name}",
            task_queue=stage.task_queue,
        )
        refused: list[tuple[WorkflowHandle[Any, Any], str]] = [
            (again, "carries memory"),
            (rollout, "only as a child of"),
        ]
        for handle, said in refused:
            with pytest.raises(WorkflowFailureError) as failed:
                await stage.result(handle)
            cause = failed.value.cause
            assert isinstance(cause, ApplicationError), cause
            assert cause.type == Failure.FORGED_REQUEST and said in str(cause), cause
        assert not stage.cluster.calls, [c.name for c in stage.cluster.calls]
