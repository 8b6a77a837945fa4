"""Histories that do not grow with wall-clock time (#26 item 3): waits of many hours,
run on Temporal's time-skipping test server against the fakes, finish (or keep
waiting) with every run of the workflow under `MAX_EVENTS_PER_RUN` events. Temporal
terminates a workflow at 51,200 events; before this, a drain of a busy pod reached
that after about 78 minutes of polling once a second."""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio.client import Client

from kama.contracts import EntitySnapshot, artifact_workflow_id
from tests.workflows.fakes import FakePod
from tests.workflows.scenarios import hf_artifact_spec, new_ref, staged
from tests.workflows.time_skipping import TimeSkippingServer
from workflows.artifact import ArtifactInput, ArtifactWorkflow
from workflows.drain import DrainInput, DrainResult, DrainWorkflow

MAX_EVENTS_PER_RUN = 10_000


async def run_lengths(client: Client, workflow_id: str, first_run: str) -> list[int]:
    """Events in each run of `workflow_id`, following its continue-as-new chain."""
    lengths, run_id = [], first_run
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        lengths.append(len(history.events))
        last = history.events[-1]
        if not last.HasField("workflow_execution_continued_as_new_event_attributes"):
            return lengths
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id


async def test_a_six_hour_drain_of_a_busy_pod(time_skipping: TimeSkippingServer) -> None:
    """A stream that never ends keeps a pod busy for the whole drainTimeout (6 h): the
    drain keeps asking, then deletes the pod at the deadline, and no run of it comes
    near Temporal's limit."""
    async with staged(time_skipping) as stage:
        pod = FakePod(
            name="busy-0", deployment="busy", fingerprint="f", ordinal=0, pod_ip="10.0.0.9",
            phase="Running", ready=True,
        )  # fmt: skip
        stage.cluster.pods[pod.name] = pod
        stage.cluster.busy_slots.extend([1] * 100_000)  # busy at every question
        workflow_id = f"drain/ns/busy-0/{uuid.uuid4().hex[:6]}"
        handle = await stage.client.start_workflow(
            DrainWorkflow.run,
            DrainInput(namespace="ns", pod=pod.name, timeout_s=6 * 3600),
            id=workflow_id,
            task_queue=stage.task_queue,
            result_type=DrainResult,
        )
        result = await stage.result(handle)
        assert result.busy_at_deletion == 1
        assert 6 * 3600 <= result.waited_s < 6 * 3600 + 60, result.waited_s
        assert [p.name for p in stage.cluster.called("Delete serving pod")] == [pod.name]
        assert len(stage.cluster.called("Mark pod draining")) == 1, "marked once, not per run"
        asked = len(stage.cluster.called("Count busy slots"))
        assert asked < 1_000, f"asked {asked} times in 6 h: the polls back off"
        lengths = await run_lengths(stage.client, workflow_id, handle.result_run_id or "")
        assert max(lengths) < MAX_EVENTS_PER_RUN, lengths


async def test_a_deletion_held_for_a_day(time_skipping: TimeSkippingServer) -> None:
    """A ModelArtifact deleted while a ModelDeployment still uses it stays (its
    finalizer held) for a day: one DeletionBlocked Event, not one every 30 s, rechecks
    backing off, every run of the workflow short; the finalizer goes once the
    deployment does."""
    async with staged(time_skipping) as stage:
        stage.cluster.artifact_users.extend([["chat"]] * 100_000)
        snapshot = EntitySnapshot(
            ref=new_ref("held"), generation=1, spec=hf_artifact_spec("acme/held"), deleting=True
        )
        handle = await stage.client.start_workflow(
            ArtifactWorkflow.run,
            ArtifactInput(snapshot=snapshot),
            id=artifact_workflow_id(snapshot.ref),
            task_queue=stage.task_queue,
        )
        await stage.skip(timedelta(hours=24))
        assert not stage.cluster.called("Release finalizer"), "held while used"
        blocked = [e for e in stage.cluster.events("held") if e.reason == "DeletionBlocked"]
        assert len(blocked) == 1, len(blocked)
        checks = len(stage.cluster.called("List deployments using artifact"))
        assert 200 < checks < 400, f"{checks} rechecks in a day"
        stage.cluster.artifact_users.clear()  # the deployment is gone
        await stage.result(handle)
        (released,) = stage.cluster.called("Release finalizer")
        assert released.ref == snapshot.ref
        lengths = await run_lengths(stage.client, handle.id, handle.result_run_id or "")
        assert max(lengths) < MAX_EVENTS_PER_RUN, lengths
