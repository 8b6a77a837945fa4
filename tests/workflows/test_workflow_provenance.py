"""Only Kama's own workflows, run by Kama's worker, have Kama's activities run
(`activities.workflow_provenance`), against the real Temporal dev server.

Issue #41: with a Temporal client and a uid read from Temporal's workflow list, an
attacker's workflow had the worker write `FitFailed=True` into another tenant's
deployment and record an Event in `kube-system`. The attacker's workflow runs on a
queue of its own and schedules the activity on Kama's: refused, the activity never
runs. So is one on Kama's queue of a type Kama does not register."""

from __future__ import annotations

import uuid

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from activities.workflow_provenance import KamaWorkflowsOnly
from tests.workflows.provenance_workflows import AttackersLookalike, AttackersOwn, KamasWorkflow

RAN: list[str] = []


@activity.defn(name="Write status")
async def write_status(what: str) -> str:
    RAN.append(what)
    return what


async def test_only_kamas_workflows_on_kamas_queue_have_activities_run(
    temporal_client: Client,
) -> None:
    kama_queue, attacker_queue = f"kama-{uuid.uuid4().hex[:6]}", f"x-{uuid.uuid4().hex[:6]}"
    check = KamaWorkflowsOnly(
        client=temporal_client, task_queue=kama_queue, workflow_types=["Keep model deployment"]
    )
    RAN.clear()
    async with (
        Worker(
            temporal_client,
            task_queue=kama_queue,
            workflows=[KamasWorkflow],
            activities=[write_status],
            interceptors=[check],
        ),
        Worker(temporal_client, task_queue=attacker_queue, workflows=[AttackersLookalike]),
    ):
        done = await temporal_client.execute_workflow(
            KamasWorkflow.run, kama_queue, id=f"kama-{uuid.uuid4().hex}", task_queue=kama_queue
        )
        assert done == "kama's"
        # the attacker's own workflow (Kama's type name, the attacker's worker and queue)
        with pytest.raises(WorkflowFailureError) as failed:
            await temporal_client.execute_workflow(
                AttackersLookalike.run,
                kama_queue,
                id=f"attack-{uuid.uuid4().hex}",
                task_queue=attacker_queue,
            )
        refused = failed.value.cause
        assert isinstance(refused, ActivityError) and isinstance(refused.cause, ApplicationError)
        assert refused.cause.type == "ForgedRequest" and refused.cause.non_retryable
        assert attacker_queue in refused.cause.message and kama_queue in refused.cause.message
    async with (
        Worker(temporal_client, task_queue=kama_queue, activities=[write_status],
               interceptors=[check]),
        Worker(temporal_client, task_queue=attacker_queue, workflows=[AttackersOwn]),
    ):  # fmt: skip
        with pytest.raises(WorkflowFailureError) as failed:
            await temporal_client.execute_workflow(
                AttackersOwn.run,
                kama_queue,
                id=f"attack-{uuid.uuid4().hex}",
                task_queue=attacker_queue,
            )
        assert isinstance(failed.value.cause, ActivityError)
        assert "'Forged task', which is not one of Kama's" in str(failed.value.cause.cause)
    assert RAN == ["kama's"], "no forged task ran"
