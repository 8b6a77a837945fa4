"""Histories that do not grow with wall-clock time (#26 item 3): waits of many hours,
run on Temporal's time-skipping test server against the fakes, finish (or keep
waiting) with every run of the workflow under `MAX_EVENTS_PER_RUN` events. Temporal
terminates a workflow at 51,200 events; before this, a drain of a busy pod reached
that after about 78 minutes of polling once a second."""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

from activities.import_payloads import DownloadedFile, PublishedArtifact
from kama.contracts import ARTIFACTS, EntitySnapshot, artifact_workflow_id
from tests.workflows.fakes import (
    ARTIFACT_DIGEST,
    MANIFEST_DIGEST,
    MODEL_FILE,
    MODEL_SHA256,
    MODEL_SIZE,
    TINY_GGUF,
    FakeCluster,
    FakeImporter,
    FakePod,
)
from tests.workflows.scenarios import Stage, hf_artifact_spec, new_ref, staged
from tests.workflows.time_skipping import TimeSkippingServer
from workflows.artifact import ArtifactInput, ArtifactWorkflow
from workflows.drain import DrainInput, DrainWorkflow
from workflows.import_model import ImportInput, ImportResult
from workflows.import_watch import ImportWatchWorkflow

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


async def child_started(client: Client, workflow_id: str, workflow_type: str) -> tuple[str, str]:
    """(workflow id, first run id) of the first child of `workflow_type` it started."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    for event in history.events:
        if event.HasField("child_workflow_execution_started_event_attributes"):
            started = event.child_workflow_execution_started_event_attributes
            if started.workflow_type.name == workflow_type:
                return started.workflow_execution.workflow_id, started.workflow_execution.run_id
    raise AssertionError(f"{workflow_id} started no {workflow_type}")


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
        stage.cluster.watch(artifact_workflow_id(snapshot.ref), snapshot)
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


IMPORT_HOURS = 6
"""3.5 times as long as the old artifact workflow lasted before Temporal's limit (below),
and long enough for the import's watch to continue as new twice."""


@workflow.defn(name="Import model", sandboxed=False)
class HoursLongImport:
    """The import child, standing in for a download of hours (a real one cannot take
    virtual time: its activity runs in real time)."""

    @workflow.run
    async def run(self, request: ImportInput) -> ImportResult:
        await workflow.sleep(timedelta(hours=IMPORT_HOURS))
        published = PublishedArtifact(
            manifest_digest=MANIFEST_DIGEST,
            artifact_digest=ARTIFACT_DIGEST,
            total_size=MODEL_SIZE,
            directory=f"{request.cache_root}/blobs/sha256/{MANIFEST_DIGEST}",
            facts=TINY_GGUF,
        )
        return ImportResult(
            commit="c" * 40,
            files=[DownloadedFile(path=MODEL_FILE, size=MODEL_SIZE, sha256=MODEL_SHA256)],
            artifact=published,
            reused=False,
            operation_id=request.operation_id,
        )


async def test_a_6_hour_import(time_skipping: TimeSkippingServer) -> None:
    """An import that takes six hours, its progress stalled at half (the fake's answer):
    the artifact workflow only starts the import and its watch and awaits the import;
    the watch reads progress every 2 s at first, then every 30 s, writes the status
    once (nothing moved after), keeps the importer pod, and continues as new. Every
    run of both stays under the limit, and the artifact ends Ready. (Before: the
    artifact workflow read, wrote and created the pod every 2 s itself, 30,187 events
    in the first hour, Temporal's limit after 1.7 hours.)"""
    env = time_skipping.env
    importer = FakeImporter()
    fake = FakeCluster(client=env.client, importer=importer)
    queue = f"control-{uuid.uuid4().hex[:8]}"
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[ArtifactWorkflow, HoursLongImport, ImportWatchWorkflow],
        activities=fake.activities(),
    ):
        try:
            stage = Stage(server=time_skipping, cluster=fake, importer=importer, task_queue=queue)
            snapshot = EntitySnapshot(
                ref=new_ref("long"), generation=1, spec=hf_artifact_spec("acme/long")
            )
            fake.watch(artifact_workflow_id(snapshot.ref), snapshot)
            handle = await stage.client.start_workflow(
                ArtifactWorkflow.run,
                ArtifactInput(snapshot=snapshot),
                id=artifact_workflow_id(snapshot.ref),
                task_queue=queue,
            )
            await stage.until(
                lambda: fake.status(ARTIFACTS, "long").get("phase") == "Ready",
                within=timedelta(hours=IMPORT_HOURS + 1),
                what="the artifact Ready after the long import",
                step=timedelta(minutes=30),
            )
            reads = len(fake.called("Read import progress"))
            # every 2 s for 30 s (15), then every 30 s, ends included (before: every
            # 2 s, 10,800 in 6 hours)
            assert reads <= 15 + IMPORT_HOURS * 120 + 1, (
                f"{reads} progress reads in {IMPORT_HOURS} h"
            )
            progress_writes = [
                w for w in fake.called("Write status") if set(w.status) == {"progress"}
            ]
            assert len(progress_writes) == 1, "written once: the progress never moved"
            lengths = await run_lengths(stage.client, handle.id, handle.result_run_id or "")
            assert max(lengths) < MAX_EVENTS_PER_RUN, lengths
            watch = await child_started(stage.client, handle.id, "Watch import")
            watch_lengths = await run_lengths(stage.client, *watch)
            assert len(watch_lengths) >= 3, f"the watch continued as new twice: {watch_lengths}"
            assert max(watch_lengths) < MAX_EVENTS_PER_RUN, watch_lengths
        finally:
            await fake.stop()
