"""Demand-driven scaling and drains that wait for the gateways, on Temporal's
time-skipping test server with the faked cluster (`fakes.py`): a sustained load above
one replica's slots scales up to what it needs (within maxReplicas) once the scale-up
window has passed, and back down one replica per stabilisation window when it stops;
a drain does not delete a pod while a gateway still has requests in flight there."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import WorkflowHandle

from kama.contracts import (
    GATEWAY_IN_FLIGHT,
    DemandReport,
    DrainReport,
    drain_workflow_id,
)
from tests.workflows import scenarios
from tests.workflows.fakes import NAMESPACE
from tests.workflows.scenarios import staged
from tests.workflows.time_skipping import TimeSkippingServer
from workflows.deployment import DeploymentWorkflow
from workflows.drain import DrainInput, DrainResult, DrainWorkflow


def replicas_set(stage: scenarios.Stage) -> list[int]:
    return [call.replicas for call in stage.cluster.called("Set deployment replicas")]


async def test_sustained_demand_scales_up_then_down_one_replica_at_a_time(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        await scenarios.autoscale(stage)


async def test_a_silent_gateways_demand_ends(time_skipping: TimeSkippingServer) -> None:
    """A gateway that crashed mid-load stops reporting: its demand no longer holds
    replicas up once it is stale (three report periods)."""
    async with staged(time_skipping) as stage:
        deployment = await scenarios.serving_deployment(
            stage, "orphan", idleTimeout="1h", maxReplicas=2, scaleDownWindow="1m"
        )
        await deployment.handle.signal(
            DeploymentWorkflow.demand, DemandReport(gateway="gw-gone", in_flight=2)
        )
        await stage.until(
            lambda: replicas_set(stage) == [2], within=timedelta(minutes=1), what="scale up"
        )
        await stage.until(
            lambda: replicas_set(stage) == [2, 1],
            within=timedelta(minutes=5),
            what="the scale-down once the silent gateway's report went stale",
        )


async def start_drain(
    stage: scenarios.Stage, pod: str, *, timeout_s: float, report: DrainReport
) -> WorkflowHandle[DrainWorkflow, DrainResult]:
    """The pod's drain, told at once that a gateway has requests there."""
    return await stage.client.start_workflow(
        DrainWorkflow.run,
        DrainInput(namespace=NAMESPACE, pod=pod, timeout_s=timeout_s),
        id=drain_workflow_id(cluster="", namespace=NAMESPACE, pod=pod),
        task_queue=stage.task_queue,
        start_signal=GATEWAY_IN_FLIGHT,
        start_signal_args=[report],
    )


async def test_a_drain_waits_for_requests_a_gateway_still_has_there(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        await scenarios.serving_deployment(stage, "draining", idleTimeout="1h")
        (pod,) = stage.cluster.pods
        drain = await start_drain(stage, pod, timeout_s=600, report=DrainReport("gw-a", 2))
        await stage.skip(timedelta(minutes=3))
        assert stage.cluster.pods[pod].draining
        assert not stage.cluster.called("Delete serving pod"), "deleted under a gateway's requests"
        await drain.signal(
            DrainWorkflow.gateway_in_flight, DrainReport(gateway="gw-a", in_flight=0)
        )
        result = await stage.result(drain)
        assert pod not in stage.cluster.pods
        assert result.busy_at_deletion == 0 and result.gateway_in_flight_at_deletion == 0
        assert 180 <= result.waited_s < 240


async def test_a_drain_gives_up_on_a_silent_gateway_at_its_timeout(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        await scenarios.serving_deployment(stage, "stuck-drain", idleTimeout="1h")
        (pod,) = stage.cluster.pods
        drain = await start_drain(stage, pod, timeout_s=120, report=DrainReport("gw-crashed", 1))
        result = await stage.result(drain)
        assert pod not in stage.cluster.pods
        assert result.gateway_in_flight_at_deletion == 1
        assert 120 <= result.waited_s < 130
