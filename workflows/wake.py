"""WakeWorkflow (`wake/<ns>/<name>`): bring a model at zero back to one ready replica.

The gateway starts it with the "use existing" conflict policy when a request finds
no ready replica, so a burst of first requests starts one wake. It asks the
DeploymentWorkflow to scale up (signal `wake`, repeated every few seconds while it
waits; the scale-up itself is the deployment's decision and goes through `/scale`),
then waits until a replica is ready (or a gateway signals `replica ready`), or fails
after the cold-start timeout saying what it saw."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from workflows.kube_calls import call_kube
from workflows.status import TaskStatus

with workflow.unsafe.imports_passed_through():
    from activities.serving_pods import PodsRequest, ServingPodActivities
    from kama.contracts import REPLICA_READY, WAKE_WORKFLOW, WakeInput, deployment_workflow_id
    from workflows.deployment import DeploymentWorkflow

READY_POLL = timedelta(seconds=1)
WAKE_AGAIN_EVERY = timedelta(seconds=3)


@dataclass(frozen=True)
class WakeResult:
    ready_pods: int
    waited_s: float


@workflow.defn(name=WAKE_WORKFLOW)
class WakeWorkflow(TaskStatus):
    def __init__(self) -> None:
        super().__init__()
        self._seen_by_gateway = False

    @workflow.signal(name=REPLICA_READY)
    def replica_ready(self) -> None:
        """A gateway routed to a replica (it may know before the kubelet's probe
        does): the wake is done, and must not ask again after, say, a user scaled
        the model back to zero."""
        self._seen_by_gateway = True

    @workflow.run
    async def run(self, request: WakeInput) -> WakeResult:
        started = workflow.now()
        deployment = workflow.get_external_workflow_handle(deployment_workflow_id(request.ref))
        deadline = started + timedelta(seconds=request.timeout_s)
        asked = started - WAKE_AGAIN_EVERY
        while True:
            if workflow.now() - asked >= WAKE_AGAIN_EVERY:
                # asked again while waiting: a replica that came and went (scaled back
                # down, crashed) before this workflow saw it must not leave the model at zero
                self._status.doing = "asking the deployment to scale up"
                await deployment.signal(DeploymentWorkflow.wake)
                asked = workflow.now()
            pods = await call_kube(
                ServingPodActivities.list_pods,
                PodsRequest(namespace=request.ref.namespace, deployment=request.ref.name),
            )
            ready = [p for p in pods if p.ready and p.serving]
            if ready or self._seen_by_gateway:
                return WakeResult(
                    ready_pods=len(ready), waited_s=(workflow.now() - started).total_seconds()
                )
            if workflow.now() >= deadline:
                seen = ", ".join(f"{p.name} {p.phase}" for p in pods) or "no pods"
                raise ApplicationError(
                    f"no ready replica after {request.timeout_s:.0f}s ({seen})",
                    type="ColdStartTimeout",
                    non_retryable=True,
                )
            self._status.doing = f"waiting for a ready replica ({len(pods)} pod(s))"
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(lambda: self._seen_by_gateway, timeout=READY_POLL)
