"""KEDA mode (`spec.scaling.autoscaler: KEDA`) on Temporal's time-skipping test server
with the faked cluster: the DeploymentWorkflow writes the ScaledObject and then stands
back (no wake, autoscale or idle scale of its own) while it still converges the pods
to whatever KEDA writes into spec.replicas; back in Kama mode it deletes the
ScaledObject and scales again; where KEDA is missing it says so and keeps scaling."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from kama.contracts import DEMAND, WAKE, DemandReport, deployment_workflow_id
from tests.workflows import scenarios
from tests.workflows.scenarios import staged
from tests.workflows.time_skipping import TimeSkippingServer
from workflows.deployment import DeploymentWorkflow


def replicas_set(stage: scenarios.Stage) -> list[int]:
    return [call.replicas for call in stage.cluster.called("Set deployment replicas")]


def reasons(stage: scenarios.Stage, name: str) -> list[str]:
    return [event.reason for event in stage.cluster.events(name)]


async def change_spec(
    stage: scenarios.Stage, deployment: scenarios.Deployment, **changes: Any
) -> None:
    """A write by someone else (KEDA's `/scale`, a user's edit), back through the watch."""
    workflow_id = deployment_workflow_id(deployment.ref)
    seen = stage.cluster.specs[workflow_id]
    spec = {**seen.spec}
    if "scaling" in changes:
        spec["scaling"] = {**spec["scaling"], **changes.pop("scaling")}
    changed = replace(seen, generation=seen.generation + 1, spec={**spec, **changes})
    await stage.cluster.change(workflow_id, changed)


async def test_keda_owns_the_replicas_while_its_scaled_object_exists(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        deployment = await scenarios.serving_deployment(
            stage,
            "keda",
            autoscaler="KEDA",
            idleTimeout="10m",
            maxReplicas=3,
            scaleUpWindow="30s",
            scaleDownWindow="5m",
        )
        scaled = stage.cluster.scaled_objects["keda"]
        assert scaled["spec"]["scaleTargetRef"]["kind"] == "ModelDeployment"
        assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (0, 3)
        assert scaled["spec"]["cooldownPeriod"] == 600
        assert "ScalingByKEDA" in reasons(stage, "keda")
        status = await deployment.handle.query(DeploymentWorkflow.status)
        assert status.autoscaler == "KEDA"

        # demand far above one slot, then none for longer than idleTimeout: Kama
        # neither scales up nor idles the model down, KEDA does
        await deployment.handle.signal(DEMAND, DemandReport(gateway="gw-a", in_flight=3))
        await stage.skip(timedelta(minutes=2))
        await deployment.handle.signal(DEMAND, DemandReport(gateway="gw-a", in_flight=0))
        await stage.skip(timedelta(minutes=15))
        assert replicas_set(stage) == [], "Kama scaled a deployment KEDA owns"

        # KEDA's scale comes back through the watch: Kama converges the pods to it
        await change_spec(stage, deployment, replicas=2)
        await stage.until(
            lambda: len([p for p in stage.cluster.pods.values() if p.ready]) == 2,
            within=timedelta(minutes=1),
            what="the second replica KEDA asked for",
        )
        await change_spec(stage, deployment, replicas=0)
        await stage.until(
            lambda: not stage.cluster.pods,
            within=timedelta(minutes=5),
            what="the replicas drained away when KEDA scaled to zero",
        )
        # a request at zero: the wake is KEDA's too (through the gateway's scaler)
        await deployment.handle.signal(WAKE)
        await stage.skip(timedelta(minutes=1))
        assert replicas_set(stage) == [], "Kama woke a deployment KEDA owns"
        assert len(stage.cluster.called("Apply KEDA ScaledObject")) == 1, (
            "the ScaledObject was written again though only spec.replicas changed"
        )

        # back to the built-in autoscaler: the ScaledObject goes, Kama wakes again
        await change_spec(stage, deployment, scaling={"autoscaler": "Kama"})
        await stage.until(
            lambda: "keda" not in stage.cluster.scaled_objects,
            within=timedelta(minutes=1),
            what="the ScaledObject deleted",
        )
        assert "ScalingByKama" in reasons(stage, "keda")
        await deployment.handle.signal(WAKE)
        await stage.until(
            lambda: replicas_set(stage) == [1],
            within=timedelta(minutes=1),
            what="Kama's own wake once KEDA stood down",
        )
        status = await deployment.handle.query(DeploymentWorkflow.status)
        assert status.autoscaler == "Kama"


async def test_without_keda_the_model_keeps_kamas_autoscaler(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping, keda_installed=False) as stage:
        deployment = await scenarios.serving_deployment(
            stage, "nokeda", autoscaler="KEDA", idleTimeout="1h", maxReplicas=3
        )
        (warning,) = [e for e in stage.cluster.events("nokeda") if e.reason == "KEDAUnavailable"]
        assert warning.type == "Warning"
        assert "scaledobjects.keda.sh" in warning.message
        assert "Kama keeps scaling" in warning.message
        await deployment.handle.signal(DEMAND, DemandReport(gateway="gw-a", in_flight=3))
        await stage.until(
            lambda: replicas_set(stage) == [3],
            within=timedelta(minutes=2),
            what="Kama's own scale-up",
        )
        assert len(stage.cluster.called("Apply KEDA ScaledObject")) == 1, (
            "a refused ScaledObject was tried again without a spec change"
        )


async def test_a_silent_gateways_demand_ends_for_keda_too(
    time_skipping: TimeSkippingServer,
) -> None:
    """KEDA reads the demand from the workflow's status: a gateway that crashed with
    requests in flight must not keep the model up forever (its report goes stale after
    three report periods, as for Kama's own autoscaler)."""
    async with staged(time_skipping) as stage:
        deployment = await scenarios.serving_deployment(
            stage, "kedastale", autoscaler="KEDA", idleTimeout="1h", scaleDownWindow="1m"
        )
        await deployment.handle.signal(DEMAND, DemandReport(gateway="gw-gone", in_flight=2))
        await stage.skip(timedelta(seconds=5))
        assert (await deployment.handle.query(DeploymentWorkflow.status)).demand == 2
        # report period here: a quarter of the 1m window, 15 s; stale after 45 s
        await stage.skip(timedelta(minutes=2))
        assert (await deployment.handle.query(DeploymentWorkflow.status)).demand == 0, (
            "a crashed gateway's demand outlived its staleness"
        )
