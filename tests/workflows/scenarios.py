"""The paths through Kama's workflows that a user would notice, each driven on a worker
whose activities are the fakes in `fakes.py`, with what the user would see asserted
along the way (conditions, replicas set, pods, finalizers).

The tests run these on Temporal's time-skipping test server, so idle timeouts and
retry back-offs take virtual minutes; `record_histories.py` runs the same scenarios
and commits their histories, which `test_replay.py` replays against the current code.
Each scenario returns the IDs of the workflows it started (children are found in
their parents' histories by the recorder).

Only names that are stable across the workflow refactors are used here: workflow
classes and their input dataclasses, signal names from `kama.contracts`, activity
names. The `status` queries are deliberately not read.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from kama.contracts import (
    ARTIFACTS,
    CACHES,
    DEMAND,
    DEPLOYMENTS,
    RETRY,
    DemandReport,
    EntitySnapshot,
    ObjectRef,
    WakeInput,
    artifact_workflow_id,
    cache_workflow_id,
    deployment_workflow_id,
    wake_workflow_id,
)
from tests.workflows.fakes import (
    CRASHES,
    MANIFEST_DIGEST,
    MODEL_FILE,
    NAMESPACE,
    Call,
    FakeCluster,
    FakeImporter,
    condition,
)
from tests.workflows.time_skipping import TimeSkippingServer
from workflows.artifact import ArtifactInput, ArtifactWorkflow
from workflows.cache import CacheInput, CacheWorkflow
from workflows.deployment import DeploymentInput, DeploymentWorkflow
from workflows.drain import DrainWorkflow
from workflows.entity_identity import StartedByKama
from workflows.import_model import ImportWorkflow
from workflows.import_watch import ImportWatchWorkflow
from workflows.rollout import RolloutWorkflow
from workflows.verify_model import VerifyWorkflow
from workflows.wake import WakeWorkflow

WORKFLOWS: list[type] = [
    ArtifactWorkflow,
    CacheWorkflow,
    DeploymentWorkflow,
    DrainWorkflow,
    ImportWatchWorkflow,
    ImportWorkflow,
    RolloutWorkflow,
    VerifyWorkflow,
    WakeWorkflow,
]

T = TypeVar("T")

LEAK_CHECK_EVERY_S = 0.5  # a wait on the test server that takes longer may be stuck


@dataclass
class Stage:
    """A worker on a fresh task queue running the real workflows against the fakes."""

    server: TimeSkippingServer
    cluster: FakeCluster
    importer: FakeImporter
    task_queue: str

    @property
    def env(self) -> WorkflowEnvironment:
        return self.server.env

    @property
    def client(self) -> Client:
        return self.env.client

    async def skip(self, duration: timedelta) -> None:
        """Let `duration` of workflow time pass (as fast as the workflows allow)."""
        await self._unstuck(self.server.sleep(duration))

    async def result(self, handle: WorkflowHandle[Any, T]) -> T:
        """The workflow's result, skipping time while it runs."""
        return await self._unstuck(handle.result())

    async def until(
        self,
        check: Callable[[], T],
        *,
        within: timedelta,
        what: str,
        step: timedelta = timedelta(seconds=1),
    ) -> T:
        """Skip time a step at a time until `check()` is truthy; fail after `within`
        of workflow time."""
        waited = timedelta(0)
        while True:
            found = check()
            if found:
                return found
            if waited >= within:
                raise AssertionError(f"not within {within}: {what}")
            await self.skip(step)
            waited += step

    async def _unstuck(self, waiting: Awaitable[T]) -> T:
        """Await while giving back locks the test server leaks (time_skipping.py)."""
        future = asyncio.ensure_future(waiting)
        while True:
            done, _ = await asyncio.wait({future}, timeout=LEAK_CHECK_EVERY_S)
            if done:
                return future.result()
            await self.server.release_orphaned_locks()


@contextlib.asynccontextmanager
async def staged(server: TimeSkippingServer, **cluster: Any) -> AsyncIterator[Stage]:
    env = server.env
    importer = FakeImporter()
    fake = FakeCluster(client=env.client, importer=importer, **cluster)
    queue = f"control-{uuid.uuid4().hex[:8]}"
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=WORKFLOWS,
        activities=fake.activities(),
        interceptors=[StartedByKama()],  # as the worker runs them
    ):
        try:
            yield Stage(server=server, cluster=fake, importer=importer, task_queue=queue)
        finally:
            await fake.stop()


def new_ref(name: str) -> ObjectRef:
    """A fresh object (its own uid, so its own workflow ID)."""
    return ObjectRef(namespace=NAMESPACE, name=name, uid=str(uuid.uuid4()))


# deployments -----------------------------------------------------------------------


@dataclass
class Deployment:
    ref: ObjectRef
    snapshot: EntitySnapshot
    handle: WorkflowHandle[Any, Any]
    started: list[str] = field(default_factory=list)  # workflow IDs, the entity first

    def status(self, stage: Stage) -> dict[str, Any]:
        return stage.cluster.status(DEPLOYMENTS, self.ref.name)

    def condition(self, stage: Stage, kind: str) -> dict[str, Any]:
        found = condition(self.status(stage), kind)
        return found or {}


def deployment_spec(*, replicas: int, **scaling: str | int) -> dict[str, Any]:
    return {
        "modelRef": {"name": "tiny"},
        "replicas": replicas,
        "runtime": {"contextSize": 1024},
        "scaling": {"idleTimeout": "10m", "coldStartTimeout": "2m", **scaling},
    }


async def start_deployment(
    stage: Stage, name: str, spec: dict[str, Any], *, ref: ObjectRef | None = None
) -> Deployment:
    """The DeploymentWorkflow of `spec`, as the watcher starts it (`ref`: another
    cluster's or namespace's object; a new one named `name` by default)."""
    ref = ref or new_ref(name)
    snapshot = EntitySnapshot(ref=ref, generation=1, spec=spec)
    workflow_id = deployment_workflow_id(ref)
    stage.cluster.watch(workflow_id, snapshot)
    handle = await stage.client.start_workflow(
        DeploymentWorkflow.run,
        DeploymentInput(snapshot=snapshot),
        id=workflow_id,
        task_queue=stage.task_queue,
    )
    return Deployment(ref=ref, snapshot=snapshot, handle=handle, started=[workflow_id])


async def serving_deployment(stage: Stage, name: str, **scaling: str | int) -> Deployment:
    """A deployment at one replica, its pod ready and the status saying so."""
    deployment = await start_deployment(stage, name, deployment_spec(replicas=1, **scaling))
    ready = await stage.until(
        lambda: deployment.condition(stage, "RuntimeReady").get("status") == "True",
        within=timedelta(minutes=1),
        what="RuntimeReady=True after the first rollout",
    )
    assert ready
    assert deployment.condition(stage, "Placed").get("status") == "True"
    assert deployment.condition(stage, "Serving").get("status") == "True"
    assert len(stage.cluster.pods) == 1 and all(p.ready for p in stage.cluster.pods.values())
    return deployment


def _calls(stage: Stage, *names: str) -> list[str]:
    return [call.name for call in stage.cluster.calls if call.name in names]


async def idle_scale_down(stage: Stage) -> list[str]:
    """One replica and no request for idleTimeout: spec.replicas goes to minReplicas
    through `/scale`, the pod is drained and the status says ScaledToZero."""
    deployment = await serving_deployment(stage, "idle", idleTimeout="10m", minReplicas=0)
    (pod,) = stage.cluster.pods
    await stage.skip(timedelta(minutes=9))
    assert not stage.cluster.called("Set deployment replicas"), "scaled before idleTimeout"
    scaled = await stage.until(
        lambda: stage.cluster.called("Set deployment replicas"),
        within=timedelta(minutes=2),
        what="a scale-down after idleTimeout",
    )
    assert [s.replicas for s in scaled] == [0]
    await stage.until(
        lambda: (
            deployment.condition(stage, "ScaledToZero").get("status") == "True"
            and not stage.cluster.pods
        ),
        within=timedelta(minutes=1),
        what="the pod drained and ScaledToZero=True",
    )
    assert deployment.condition(stage, "RuntimeReady")["reason"] == "ScaledToZero"
    assert deployment.condition(stage, "Serving").get("status") == "False"
    assert [p.name for p in stage.cluster.called("Mark pod draining")] == [pod]
    assert [p.name for p in stage.cluster.called("Delete serving pod")] == [pod]
    (event,) = [e for e in stage.cluster.events(deployment.ref.name) if e.reason == "Scaled"]
    assert "idleTimeout" in event.message and "spec.replicas set to 0" in event.message
    return deployment.started


async def wake_from_zero(stage: Stage) -> list[str]:
    """A model at zero gets a request: the gateway's WakeWorkflow asks the deployment,
    which scales to one through `/scale` and rolls out a pod; the wake completes once
    that pod is ready."""
    deployment = await start_deployment(stage, "sleepy", deployment_spec(replicas=0))
    await stage.until(
        lambda: deployment.condition(stage, "ScaledToZero").get("status") == "True",
        within=timedelta(minutes=1),
        what="a deployment at zero says ScaledToZero",
    )
    assert not stage.cluster.pods and not stage.cluster.called("Create serving pod")
    wake_id = wake_workflow_id(
        cluster=deployment.ref.cluster, namespace=deployment.ref.namespace, name=deployment.ref.name
    )
    wake = await stage.client.start_workflow(
        WakeWorkflow.run,
        WakeInput(ref=deployment.ref, timeout_s=120),
        id=wake_id,
        task_queue=stage.task_queue,
    )
    result = await stage.result(wake)
    assert result.ready_pods == 1
    assert [s.replicas for s in stage.cluster.called("Set deployment replicas")] == [1]
    assert len(stage.cluster.pods) == 1 and all(p.ready for p in stage.cluster.pods.values())
    await stage.until(
        lambda: deployment.condition(stage, "RuntimeReady").get("status") == "True",
        within=timedelta(seconds=30),
        what="RuntimeReady=True after the wake",
    )
    assert "lastWake" in deployment.status(stage)
    assert deployment.condition(stage, "ScaledToZero").get("status") == "False"
    return [*deployment.started, wake_id]


def runtime_reason(call: Call) -> str | None:
    """The RuntimeReady reason a `Write status` call wrote, if it wrote one."""
    if call.name != "Write status" or call.argument.kind_plural != DEPLOYMENTS:
        return None
    found = condition(call.argument.status, "RuntimeReady")
    return found["reason"] if found else None


async def failed_rollout(stage: Stage, *, reason: str, pods_per_try: int) -> list[str]:
    """Pods that never become ready (the cluster's `pod_fate`): the rollout gives up
    after a bounded number of pods with a reason in RuntimeReady."""
    deployment = await start_deployment(stage, "broken", deployment_spec(replicas=1))
    await stage.until(
        lambda: deployment.condition(stage, "RuntimeReady").get("reason") == reason,
        within=timedelta(minutes=3),
        what=f"RuntimeReady=False with reason {reason}",
    )
    runtime = deployment.condition(stage, "RuntimeReady")
    assert runtime["status"] == "False" and runtime["message"], runtime
    calls = stage.cluster.calls
    first = next(i for i, call in enumerate(calls) if runtime_reason(call) == reason)
    created = [
        c.argument.manifest()["metadata"]["name"]
        for c in calls[:first]
        if c.name == "Create serving pod"
    ]
    assert len(created) == pods_per_try, created
    return deployment.started


async def delete_with_drain(stage: Stage) -> list[str]:
    """Deleting a serving deployment: its pod is marked draining, deleted only once
    llama-server reports no busy slot, and then the finalizer is released (the
    workflow ends)."""
    deployment = await serving_deployment(stage, "retired")
    (pod,) = stage.cluster.pods
    stage.cluster.busy_slots.extend([1, 1])  # a stream still running for two polls
    stage.cluster.calls.clear()
    await stage.cluster.change(deployment.handle.id, replace(deployment.snapshot, deleting=True))
    await stage.result(deployment.handle)
    order = _calls(
        stage, "Mark pod draining", "Count busy slots", "Delete serving pod", "Release finalizer"
    )
    assert order == [
        "Mark pod draining",
        "Count busy slots",
        "Count busy slots",
        "Count busy slots",
        "Delete serving pod",
        "Release finalizer",
    ], order
    assert [p.name for p in stage.cluster.called("Delete serving pod")] == [pod]
    (released,) = stage.cluster.called("Release finalizer")
    assert released.plural == DEPLOYMENTS and released.ref == deployment.ref
    assert not stage.cluster.pods
    return deployment.started


# artifacts and caches ----------------------------------------------------------------


def hf_artifact_spec(repo: str) -> dict[str, Any]:
    return {
        "source": {"huggingFace": {"repo": repo, "revision": "main", "files": [MODEL_FILE]}},
        "cacheRef": {"name": "models"},
    }


async def start_artifact(
    stage: Stage, name: str, spec: dict[str, Any]
) -> tuple[EntitySnapshot, WorkflowHandle[Any, Any]]:
    ref = new_ref(name)
    snapshot = EntitySnapshot(ref=ref, generation=1, spec=spec)
    stage.cluster.watch(artifact_workflow_id(ref), snapshot)
    handle = await stage.client.start_workflow(
        ArtifactWorkflow.run,
        ArtifactInput(snapshot=snapshot),
        id=artifact_workflow_id(ref),
        task_queue=stage.task_queue,
    )
    return snapshot, handle


def artifact_condition(stage: Stage, name: str, kind: str) -> dict[str, Any]:
    return condition(stage.cluster.status(ARTIFACTS, name), kind) or {}


async def artifact_retry(stage: Stage) -> list[str]:
    """An import that fails with a typed error (a token the source refuses) marks the
    artifact Failed with that reason and waits; the `retry` signal imports again and
    the artifact becomes Ready. Deleting it waits until no deployment uses it."""
    stage.importer.resolve_failures.append(
        ApplicationError(
            "acme/private: 401 Unauthorized (is the token right?)",
            type="SourceUnavailable",
            non_retryable=True,
        )
    )
    snapshot, handle = await start_artifact(stage, "private", hf_artifact_spec("acme/private"))
    name = snapshot.ref.name
    await stage.until(
        lambda: artifact_condition(stage, name, "Ready").get("reason") == "SourceUnavailable",
        within=timedelta(minutes=1),
        what="Ready=False with reason SourceUnavailable",
    )
    status = stage.cluster.status(ARTIFACTS, name)
    assert status["phase"] == "Failed"
    assert artifact_condition(stage, name, "Ready")["status"] == "False"
    assert "401" in artifact_condition(stage, name, "Ready")["message"]
    assert artifact_condition(stage, name, "SourceUnavailable")["status"] == "True"
    await stage.until(  # the Event is recorded after the status write
        lambda: any(
            e.type == "Warning" and e.reason == "SourceUnavailable"
            for e in stage.cluster.events(name)
        ),
        within=timedelta(seconds=10),
        what="a SourceUnavailable Warning Event",
    )
    await stage.until(
        lambda: len(stage.cluster.called("Delete pod")) == 1,
        within=timedelta(seconds=10),
        what="the importer pod removed",
    )

    await stage.skip(timedelta(minutes=30))
    assert len(stage.importer.called("Resolve Hugging Face source")) == 1, "retried unasked"

    await handle.signal(RETRY)
    await stage.until(
        lambda: artifact_condition(stage, name, "Ready").get("status") == "True",
        within=timedelta(minutes=1),
        what="Ready=True after the retry",
    )
    status = stage.cluster.status(ARTIFACTS, name)
    assert status["phase"] == "Ready" and status["manifestDigest"] == f"sha256:{MANIFEST_DIGEST}"
    assert artifact_condition(stage, name, "SourceUnavailable")["status"] == "False"
    assert len(stage.importer.called("Resolve Hugging Face source")) == 2
    assert len(stage.importer.called("Download file into cache staging")) == 1
    assert len(stage.cluster.called("Delete pod")) == 2

    stage.cluster.artifact_users.append(["chat"])  # a ModelDeployment still uses it
    await stage.cluster.change(handle.id, replace(snapshot, deleting=True))
    await stage.until(
        lambda: any(e.reason == "DeletionBlocked" for e in stage.cluster.events(name)),
        within=timedelta(seconds=30),
        what="deletion held while a deployment uses the artifact",
    )
    assert not stage.cluster.called("Release finalizer")
    await stage.result(handle)
    (released,) = stage.cluster.called("Release finalizer")
    assert released.plural == ARTIFACTS and released.ref == snapshot.ref
    return [handle.id]


async def artifact_in_place(stage: Stage) -> list[str]:
    """A claim in Direct mode: the file is verified where it is (VerifyWorkflow), never
    copied, and the artifact is served from that claim."""
    spec = {
        "source": {
            "persistentVolumeClaim": {"claimName": "weights", "path": MODEL_FILE, "mode": "Direct"}
        }
    }
    snapshot, handle = await start_artifact(stage, "in-place", spec)
    name = snapshot.ref.name
    await stage.until(
        lambda: artifact_condition(stage, name, "Ready").get("status") == "True",
        within=timedelta(minutes=1),
        what="Ready=True for a Direct claim",
    )
    status = stage.cluster.status(ARTIFACTS, name)
    assert status["servingLocation"]["claimName"] == "weights"
    assert stage.importer.called("Verify files in place")
    assert not stage.importer.called("Copy file into cache staging")
    await stage.cluster.change(handle.id, replace(snapshot, deleting=True))
    await stage.result(handle)
    return [handle.id]


async def cache_lifecycle(stage: Stage) -> list[str]:
    """A cache from a claim template reports its claim Ready; deleted with
    retentionPolicy Delete, it waits for its artifacts to go, then deletes the claim
    it created and releases the finalizer."""
    ref = new_ref("models")
    snapshot = EntitySnapshot(
        ref=ref,
        generation=1,
        spec={"claimTemplate": {"size": "10Gi"}, "retentionPolicy": "Delete"},
    )
    stage.cluster.watch(cache_workflow_id(ref), snapshot)
    handle = await stage.client.start_workflow(
        CacheWorkflow.run,
        CacheInput(snapshot=snapshot),
        id=cache_workflow_id(ref),
        task_queue=stage.task_queue,
    )

    def ready() -> dict[str, Any]:
        return condition(stage.cluster.status(CACHES, ref.name), "Ready") or {}

    await stage.until(
        lambda: ready().get("status") == "True", within=timedelta(seconds=30), what="Ready"
    )
    assert stage.cluster.status(CACHES, ref.name)["claimName"] == "kama-cache-models"
    stage.cluster.cache_users.append(["tiny"])
    await stage.cluster.change(handle.id, replace(snapshot, deleting=True))
    await stage.result(handle)
    assert len(stage.cluster.called("List artifacts using cache")) == 2, "waited for the user"
    assert _calls(stage, "Delete cache claim", "Release finalizer") == [
        "Delete cache claim",
        "Release finalizer",
    ]
    return [handle.id]


@dataclass(frozen=True)
class Case:
    """A scenario and the cluster it runs against."""

    run: Callable[[Stage], Awaitable[list[str]]]
    cluster: dict[str, Any] = field(default_factory=dict)


async def crashing_rollout(stage: Stage) -> list[str]:
    return await failed_rollout(stage, reason="RuntimeFailed", pods_per_try=3)


def _replicas_set(stage: Stage) -> list[int]:
    return [call.replicas for call in stage.cluster.called("Set deployment replicas")]


async def autoscale(stage: Stage) -> list[str]:
    """A sustained load above one replica's slots (reported by a gateway) scales up to
    what it needs once the scale-up window has passed; when it stops, one replica goes
    per stabilisation window, never below one (zero is idleTimeout's)."""
    deployment = await serving_deployment(
        stage,
        "busy",
        idleTimeout="1h",
        maxReplicas=3,
        scaleUpWindow="30s",
        scaleDownWindow="5m",
    )
    # one slot a replica (concurrency 1): 3 requests want 3 replicas at 80 %
    await deployment.handle.signal(DEMAND, DemandReport(gateway="gw-a", in_flight=2, queued=1))
    await stage.skip(timedelta(seconds=20))
    assert _replicas_set(stage) == [], "scaled up before the scale-up window"
    await stage.until(
        lambda: _replicas_set(stage),
        within=timedelta(seconds=20),
        what="the scale-up once demand lasted the window",
    )
    assert _replicas_set(stage) == [3]
    await stage.until(
        lambda: len([p for p in stage.cluster.pods.values() if p.ready]) == 3,
        within=timedelta(minutes=1),
        what="three ready replicas",
    )
    # the load stops: the gateway says so; one replica per window, never to zero
    await deployment.handle.signal(DEMAND, DemandReport(gateway="gw-a", in_flight=0))
    await stage.skip(timedelta(minutes=4))
    assert _replicas_set(stage) == [3], "scaled down inside the stabilisation window"
    await stage.until(
        lambda: _replicas_set(stage) == [3, 2],
        within=timedelta(minutes=2),
        what="one replica less after the window",
    )
    await stage.until(
        lambda: _replicas_set(stage) == [3, 2, 1],
        within=timedelta(minutes=6),
        what="another one a window later",
    )
    await stage.skip(timedelta(minutes=12))
    assert _replicas_set(stage) == [3, 2, 1], "autoscaling went below one (idleTimeout's job)"
    assert len(stage.cluster.pods) == 1, "the drained replicas are gone"
    return deployment.started


CASES: dict[str, Case] = {
    "idle-scale-down": Case(idle_scale_down),
    "wake": Case(wake_from_zero),
    "failed-rollout": Case(crashing_rollout, {"pod_fate": CRASHES}),
    "deleted-with-drain": Case(delete_with_drain),
    "retry": Case(artifact_retry),
    "in-place": Case(artifact_in_place),
    "lifecycle": Case(cache_lifecycle),
    "autoscale": Case(autoscale),
}
"""The cases `record_histories.py` records, by the name their files carry."""
