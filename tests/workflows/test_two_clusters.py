"""Two clusters share one Temporal namespace: the same ModelDeployment (same
namespace, name, even uid) in clusters `east` and `west` gets two workflows, each
worked by its own cluster's worker on its own control queue, and deleting it in one
cluster drains and deletes only that cluster's pod (the drain workflows, same pod name
in both clusters, are two workflows too)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

from temporalio.worker import Worker

from kama.config import Settings
from kama.contracts import (
    ObjectRef,
    drain_workflow_id,
)
from tests.workflows import scenarios
from tests.workflows.fakes import NAMESPACE, FakeCluster, FakeImporter
from tests.workflows.scenarios import WORKFLOWS, Deployment, Stage
from tests.workflows.time_skipping import TimeSkippingServer


@contextlib.asynccontextmanager
async def cluster_stage(server: TimeSkippingServer, *, settings: Settings) -> AsyncIterator[Stage]:
    """One cluster's worker, polling the control queue its settings name."""
    importer = FakeImporter()
    fake = FakeCluster(client=server.env.client, importer=importer)
    queue = settings.control_task_queue
    async with Worker(
        server.env.client, task_queue=queue, workflows=WORKFLOWS, activities=fake.activities()
    ):
        try:
            yield Stage(server=server, cluster=fake, importer=importer, task_queue=queue)
        finally:
            await fake.stop()


async def _serving(stage: Stage, ref: ObjectRef) -> Deployment:
    deployment = await scenarios.start_deployment(
        stage, ref.name, scenarios.deployment_spec(replicas=1), ref=ref
    )
    workflow_id = deployment.started[0]
    await stage.until(
        lambda: deployment.condition(stage, "RuntimeReady").get("status") == "True",
        within=timedelta(minutes=1),
        what=f"{workflow_id} serving",
    )
    return deployment


async def test_two_clusters_in_one_namespace_keep_to_their_own_workflows(
    time_skipping: TimeSkippingServer,
) -> None:
    base = f"control-{uuid.uuid4().hex[:8]}"
    east_settings = Settings(cluster="east", control_queue=base)
    west_settings = Settings(cluster="west", control_queue=base)
    assert east_settings.control_task_queue != west_settings.control_task_queue
    same = ObjectRef(namespace=NAMESPACE, name="shared", uid=str(uuid.uuid4()))
    async with (
        cluster_stage(time_skipping, settings=east_settings) as east,
        cluster_stage(time_skipping, settings=west_settings) as west,
    ):
        in_east = await _serving(east, replace(same, cluster="east"))
        in_west = await _serving(west, replace(same, cluster="west"))
        assert in_east.handle.id == f"east:deployment/{same.namespace}/shared/{same.uid}"
        assert in_west.handle.id == f"west:deployment/{same.namespace}/shared/{same.uid}"
        ((east_pod,), (west_pod,)) = east.cluster.pods, west.cluster.pods
        assert east_pod == west_pod  # the same pod name in both clusters

        east.cluster.calls.clear()
        west.cluster.calls.clear()
        await east.cluster.change(in_east.handle.id, replace(in_east.snapshot, deleting=True))
        await east.result(in_east.handle)

        assert not east.cluster.pods
        assert [p.name for p in east.cluster.called("Delete serving pod")] == [east_pod]
        drain = await east.client.get_workflow_handle(
            drain_workflow_id(cluster="east", namespace=same.namespace, pod=east_pod)
        ).describe()
        assert drain.task_queue == east_settings.control_task_queue
        # west's deployment, its pod and its worker saw none of it
        assert list(west.cluster.pods) == [west_pod]
        assert not west.cluster.called("Mark pod draining")
        assert not west.cluster.called("Delete serving pod")
        assert (await in_west.handle.describe()).status is not None
        assert in_west.condition(west, "RuntimeReady").get("status") == "True"
