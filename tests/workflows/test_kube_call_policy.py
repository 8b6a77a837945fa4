"""Kama's Kubernetes call policy (`workflows.kube_calls`) on the real Temporal dev
server: an activity that fails with a programming error (ValueError, KeyError,
TypeError, AttributeError: the same input fails the same way every time) ends the
call after one attempt instead of retrying without limit (#26, item 4); an API
server answer that may change (a 409) is still retried."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from activities.kube_errors import Conflict, KubeTarget
from tests.workflows.kube_call_probe import ProbeActivities, ProbeWorkflow


async def run_probe(client: Client, failure: BaseException, *, wait_s: float) -> ProbeActivities:
    probe = ProbeActivities(fail_with=failure)
    queue = f"probe-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client, task_queue=queue, workflows=[ProbeWorkflow], activities=[probe.probe]
    ):
        handle = await client.start_workflow(
            ProbeWorkflow.run, "x", id=f"probe-{uuid.uuid4().hex}", task_queue=queue
        )
        try:
            await asyncio.wait_for(handle.result(), timeout=wait_s)
        except WorkflowFailureError as failed:
            assert isinstance(failed.cause, ActivityError)
            assert isinstance(failed.cause.cause, ApplicationError)
            assert failed.cause.cause.type == type(failure).__name__
        except TimeoutError:
            await handle.terminate()
    return probe


@pytest.mark.parametrize(
    "failure",
    [ValueError("bad value"), KeyError("status"), TypeError("None"), AttributeError("x")],
    ids=lambda e: type(e).__name__,
)
async def test_a_programming_error_is_not_retried(
    temporal_client: Client, failure: BaseException
) -> None:
    probe = await run_probe(temporal_client, failure, wait_s=8)
    assert probe.attempts == 1


async def test_a_conflict_is_still_retried(temporal_client: Client) -> None:
    conflict = Conflict(
        status=409, verb="patch", target=KubeTarget(resource="pods"), api_message="changed"
    )
    probe = await run_probe(temporal_client, conflict, wait_s=4)
    assert probe.attempts >= 2
