"""DeploymentWorkflow, WakeWorkflow, RolloutWorkflow and DrainWorkflow on Temporal's
time-skipping test server with faked Kubernetes and llama-server (`fakes.py`): scale
to zero after the idle timeout, wake from zero, a rollout whose pods never become
ready and the pause before the next one, deletion that drains, the `Ready` and
`Degraded` conditions, replicas kept on the node of a local volume. Virtual minutes,
real milliseconds."""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from kama.contracts import (
    ARTIFACTS,
    DEPLOYMENTS,
    SPEC_CHANGED,
    DemandReport,
    WakeInput,
    wake_workflow_id,
)
from tests.workflows import scenarios
from tests.workflows.fakes import (
    CRASHES,
    NODES,
    STARTS_READY,
    STAYS_PENDING,
    condition,
    ready_artifact_status,
)
from tests.workflows.scenarios import Stage, staged
from tests.workflows.time_skipping import TimeSkippingServer
from workflows.deployment import DeploymentWorkflow
from workflows.wake import WakeWorkflow


async def test_idle_deployment_scales_to_min_replicas(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        await scenarios.idle_scale_down(stage)


async def test_busy_slots_count_as_demand(time_skipping: TimeSkippingServer) -> None:
    """A long stream no gateway reported keeps the model up for another idleTimeout."""
    async with staged(time_skipping) as stage:
        await scenarios.serving_deployment(stage, "streaming", idleTimeout="10m")
        stage.cluster.busy_slots.append(2)
        await stage.skip(timedelta(minutes=11))
        assert len(stage.cluster.called("Count busy slots")) == 1, "asked at the idle timeout"
        assert not stage.cluster.called("Set deployment replicas")
        busy_seen = await stage.env.get_current_time()
        scaled = await stage.until(
            lambda: stage.cluster.called("Set deployment replicas"),
            within=timedelta(minutes=10),
            what="the scale-down one idleTimeout after the busy slot",
        )
        assert await stage.env.get_current_time() - busy_seen >= timedelta(minutes=8)
        assert [s.replicas for s in scaled] == [0]


async def scaled_to_zero_only_after(
    stage: Stage, wait: timedelta, *, kept_for: timedelta, why: str
) -> None:
    """From now, still at one replica after `kept_for`, then scaled to zero, but not
    before `wait` has passed."""
    since = await stage.env.get_current_time()
    await stage.skip(kept_for)
    assert not stage.cluster.called("Set deployment replicas"), f"scaled to zero {why}"
    scaled = await stage.until(
        lambda: stage.cluster.called("Set deployment replicas"),
        within=wait * 2,
        what=f"the scale-down {wait} from now",
    )
    assert await stage.env.get_current_time() - since >= wait
    assert [s.replicas for s in scaled] == [0]


async def test_a_fresh_report_of_a_stream_keeps_the_model_up(
    time_skipping: TimeSkippingServer,
) -> None:
    """llama-server finished generating (no busy slot) but a gateway still relays the
    stream to a slow client and said so in its last report; that report is late (a
    loaded gateway or Temporal), not stale: the model stays up until it goes stale."""
    async with staged(time_skipping) as stage:
        deployment = await scenarios.serving_deployment(stage, "relaying", idleTimeout="8s")
        # idleTimeout 8s: a report period of 4s, stale after 12s
        await deployment.handle.signal(
            DeploymentWorkflow.demand, DemandReport(gateway="gw-slow", in_flight=1)
        )
        await scaled_to_zero_only_after(
            stage,
            timedelta(seconds=12),
            kept_for=timedelta(seconds=10),
            why="under a stream a gateway reported in flight",
        )


async def test_the_idle_clock_starts_when_the_replica_is_serving(
    time_skipping: TimeSkippingServer,
) -> None:
    """A replica that takes most of idleTimeout to load is not scaled away the moment
    it becomes ready: nobody could have asked it anything yet."""
    async with staged(time_skipping, pod_fate=STAYS_PENDING) as stage:
        await scenarios.start_deployment(
            stage, "slow-loader", scenarios.deployment_spec(replicas=1, idleTimeout="1m")
        )
        await stage.skip(timedelta(seconds=50))  # the model is still loading
        stage.cluster.pod_fate = STARTS_READY
        await scaled_to_zero_only_after(
            stage,
            timedelta(minutes=1),
            kept_for=timedelta(seconds=40),  # past idleTimeout since the start
            why="seconds after the replica became ready",
        )


async def test_wake_scales_from_zero_until_a_replica_is_ready(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        await scenarios.wake_from_zero(stage)


async def test_wake_gives_up_after_its_timeout_saying_what_it_saw(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping, pod_fate=STAYS_PENDING) as stage:
        deployment = await scenarios.start_deployment(
            stage, "stuck", scenarios.deployment_spec(replicas=0)
        )
        with pytest.raises(WorkflowFailureError) as failure:
            wake = await stage.client.start_workflow(
                WakeWorkflow.run,
                WakeInput(ref=deployment.ref, timeout_s=60),
                id=wake_workflow_id(cluster="", namespace=deployment.ref.namespace, name="stuck"),
                task_queue=stage.task_queue,
            )
            await stage.result(wake)
        cause = failure.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "ColdStartTimeout"
        (pod,) = stage.cluster.pods
        assert f"{pod} Pending" in cause.message
        assert [s.replicas for s in stage.cluster.called("Set deployment replicas")] == [1]


@pytest.mark.parametrize(
    ("fate", "reason", "pods_per_try"),
    [(CRASHES, "RuntimeFailed", 3), (STAYS_PENDING, "ProgressDeadlineExceeded", 1)],
    ids=["pods-crash", "pods-never-ready"],
)
async def test_failed_rollout_gives_up_and_says_why(
    time_skipping: TimeSkippingServer, fate: str, reason: str, pods_per_try: int
) -> None:
    async with staged(time_skipping, pod_fate=fate) as stage:
        await scenarios.failed_rollout(stage, reason=reason, pods_per_try=pods_per_try)
        status = stage.cluster.status(DEPLOYMENTS, "broken")
        runtime = condition(status, "RuntimeReady") or {}
        if fate == CRASHES:
            assert "runtime exited 1" in runtime["message"], runtime
        ready = condition(status, "Ready") or {}
        assert (ready.get("status"), ready.get("reason")) == ("False", reason), ready
        assert ready["message"] == runtime["message"]


RETRY_FAILED_ROLLOUT = timedelta(seconds=30)  # the pause workflows/deployment.py promises


async def test_crashing_runtime_is_tried_again_only_after_a_pause(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping, pod_fate=CRASHES) as stage:
        await scenarios.failed_rollout(stage, reason="RuntimeFailed", pods_per_try=3)
        await stage.until(
            lambda: len(stage.cluster.called("Create serving pod")) > 3,
            within=timedelta(minutes=2),
            what="another rollout after the first one failed",
        )
        calls = stage.cluster.calls
        failed_at = next(c.at for c in calls if scenarios.runtime_reason(c) == "RuntimeFailed")
        again_at = [c.at for c in calls if c.name == "Create serving pod"][3]
        assert again_at - failed_at >= RETRY_FAILED_ROLLOUT, (
            f"a new pod {again_at - failed_at} after the rollout failed"
        )


async def test_deletion_drains_pods_then_releases_finalizer(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        await scenarios.delete_with_drain(stage)


async def test_the_watchers_echo_does_not_cut_the_pause_short(
    time_skipping: TimeSkippingServer,
) -> None:
    """The watcher signals `spec changed` with the same generation on every change of
    the object, the deployment's own status writes included: the pause holds."""
    async with staged(time_skipping, pod_fate=CRASHES) as stage:
        await scenarios.failed_rollout(stage, reason="RuntimeFailed", pods_per_try=3)
        (workflow_id,) = stage.cluster.specs
        await stage.client.get_workflow_handle(workflow_id).signal(
            SPEC_CHANGED, stage.cluster.specs[workflow_id]
        )
        await stage.skip(RETRY_FAILED_ROLLOUT / 2)
        assert len(stage.cluster.called("Create serving pod")) == 3, "the echo ended the pause"
        await stage.until(
            lambda: len(stage.cluster.called("Create serving pod")) > 3,
            within=RETRY_FAILED_ROLLOUT,
            what="another rollout after the pause",
        )


def ready_of(stage: Stage, name: str) -> tuple[str, str]:
    found = condition(stage.cluster.status(DEPLOYMENTS, name), "Ready") or {}
    return found.get("status", ""), found.get("reason", "")


async def test_ready_when_all_replicas_are_or_when_at_zero_and_able_to_wake(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        await scenarios.serving_deployment(stage, "ready", idleTimeout="10m")
        assert ready_of(stage, "ready") == ("True", "AllReplicasReady")
        await stage.until(
            lambda: not stage.cluster.pods and ready_of(stage, "ready")[1] == "ScaledToZero",
            within=timedelta(minutes=12),
            what="Ready=True, ScaledToZero after the idle timeout",
        )
        assert ready_of(stage, "ready") == ("True", "ScaledToZero")


async def test_not_ready_while_the_artifact_is_missing(time_skipping: TimeSkippingServer) -> None:
    async with staged(time_skipping, artifact_status=None) as stage:
        await scenarios.start_deployment(stage, "orphan", scenarios.deployment_spec(replicas=1))
        await stage.until(
            lambda: ready_of(stage, "orphan")[0],
            within=timedelta(seconds=30),
            what="a Ready condition",
        )
        assert ready_of(stage, "orphan") == ("False", "ArtifactMissing")


async def test_forged_gguf_facts_end_in_a_condition_not_a_retried_task(
    time_skipping: TimeSkippingServer,
) -> None:
    """Anyone who may write an artifact's status can forge its GGUF facts; the planner
    runs in workflow code, where 3e8 layers once took the shared worker out of memory
    and failed the workflow task forever (replayed on every restart). Facts past
    `kama.api.gguf_bounds` make the artifact unusable, said in a condition (each
    bounded field: tests/unit/test_api_models.py)."""
    field = "layers"
    status = ready_artifact_status()
    status["gguf"] = {**status["gguf"], field: 300_000_000}
    async with staged(time_skipping, artifact_status=status) as stage:
        await scenarios.start_deployment(stage, "forged", scenarios.deployment_spec(replicas=1))
        await stage.until(
            lambda: ready_of(stage, "forged")[1] == "ArtifactNotUsable",
            within=timedelta(seconds=30),
            what="the artifact found unusable",
        )
        found = condition(stage.cluster.status(DEPLOYMENTS, "forged"), "ArtifactReady") or {}
        assert field in found["message"], found
        assert not stage.cluster.pods, "nothing placed from forged facts"


async def test_cpu_placement_asked_for_is_not_degraded(time_skipping: TimeSkippingServer) -> None:
    async with staged(time_skipping) as stage:
        spec = {**scenarios.deployment_spec(replicas=0), "placement": {"mode": "CPU"}}
        deployment = await scenarios.start_deployment(stage, "cpu", spec)
        await stage.until(
            lambda: deployment.condition(stage, "Placed").get("status") == "True",
            within=timedelta(seconds=30),
            what="Placed=True",
        )
        degraded = deployment.condition(stage, "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("False", "AsRequested"), degraded
        assert "placement.mode CPU" in degraded["message"] and "GPU" not in degraded["message"]


LOCAL_VOLUME = {
    "required": {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}
                ]
            }
        ]
    }
}
ROOMY_NODE = {
    "metadata": {"name": "node-b", "labels": {"kubernetes.io/hostname": "node-b"}},
    "spec": {},
    "status": {"allocatable": {"cpu": "8", "memory": "64Gi"}},
}


async def test_replicas_of_an_artifact_on_a_local_volume_run_on_its_node(
    time_skipping: TimeSkippingServer,
) -> None:
    """The claim is bound to a local ReadWriteOnce volume on node-a: the artifact says
    so in servingLocation, and a deployment of it (whose planner would otherwise prefer
    the roomier node-b) runs both replicas there, pinned, as such a claim needs."""
    async with staged(
        time_skipping,
        nodes=[*NODES, ROOMY_NODE],
        claim_node_affinity=LOCAL_VOLUME,
        source_access_modes=["ReadWriteOnce"],
    ) as stage:
        await scenarios.artifact_in_place(stage)
        published = stage.cluster.status(ARTIFACTS, "in-place")
        assert published["servingLocation"]["nodeAffinity"] == LOCAL_VOLUME
        stage.cluster.artifact_status = published
        deployment = await scenarios.start_deployment(
            stage, "pinned", scenarios.deployment_spec(replicas=2, maxReplicas=2)
        )
        await stage.until(
            lambda: deployment.condition(stage, "RuntimeReady").get("status") == "True",
            within=timedelta(minutes=1),
            what="two replicas ready",
        )
        assert deployment.status(stage)["profile"]["node"] == "node-a"
        pinned = [
            c.manifest()["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"]
            for c in stage.cluster.called("Create serving pod")
        ]
        on_a = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]
        assert pinned == [on_a, on_a]


async def test_desired_replicas_follow_min_replicas(time_skipping: TimeSkippingServer) -> None:
    """`kubectl get md` shows what Kama converges to: with `minReplicas: 1`, a spec
    at zero replicas is served by one replica and DESIRED says 1, not 0."""
    async with staged(time_skipping) as stage:
        deployment = await scenarios.start_deployment(
            stage, "floor", scenarios.deployment_spec(replicas=0, minReplicas=1, maxReplicas=2)
        )
        await stage.until(
            lambda: deployment.status(stage).get("readyReplicas") == 1,
            within=timedelta(minutes=1),
            what="one ready replica for minReplicas 1",
        )
        status = deployment.status(stage)
        assert (status["desiredReplicas"], status["ready"]) == (1, "1/1")
        assert len(stage.cluster.pods) == 1
