"""RolloutWorkflow: converge one ModelDeployment's pods onto a serving template.

Each round lists the pods, asks the pure `plan_rollout` what to do, does it (create
replicas of the new fingerprint, remove dead pods, start a DrainWorkflow for each
pod to retire) and sleeps briefly. New pods are ready before old ones drain, so
capacity never drops during a template change. It ends when converged, when pods of
the new template keep dying (a broken runtime should not be recreated forever), at
the progress deadline, or when the API server refuses a call for good (a missing
permission: `permanent`); the DeploymentWorkflow reports why and tries again later.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ChildWorkflowError, WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

from workflows.kube_calls import call_kube, permanent_failure
from workflows.status import TaskStatus

with workflow.unsafe.imports_passed_through():
    from activities.serving_pods import CreatePod, PodName, PodsRequest, ServingPodActivities
    from kama.contracts import (
        ObjectRef,
        deployment_workflow_id,
        drain_workflow_id,
        rollout_workflow_id,
    )
    from kama.rollout import ObservedPod, RolloutStep, plan_rollout
    from kama.serving_pod import ServingTemplate
    from workflows.drain import DrainInput, DrainWorkflow

ROUND_INTERVAL = timedelta(seconds=1)
MAX_FAILED_PODS = 3


@dataclass(frozen=True)
class RolloutInput:
    ref: ObjectRef
    template: ServingTemplate
    desired: int
    next_ordinal: int
    deadline_s: float
    # the pods the caller has just listed: the first round acts on them instead of
    # listing again (one activity less between a wake and its pod)
    observed: list[ObservedPod] | None = None


@dataclass(frozen=True)
class RolloutResult:
    converged: bool
    next_ordinal: int
    ready: int
    replicas: int
    reason: str = ""
    message: str = ""
    permanent: bool = False  # the API server refused a call: retrying will not help


@workflow.defn(name="Roll out model deployment")
class RolloutWorkflow(TaskStatus):
    def __init__(self) -> None:
        super().__init__()
        self._next_ordinal = 0
        self._step: RolloutStep | None = None

    @staticmethod
    def start_refusal(request: RolloutInput) -> str | None:
        """A rollout runs only as a child of its deployment's workflow, which planned
        its template from the live spec (`workflows.entity_identity`)."""
        parent = workflow.info().parent
        own = deployment_workflow_id(request.ref)
        if parent is None or parent.workflow_id != own:
            by = "no parent" if parent is None else f"parent {parent.workflow_id!r}"
            return (
                f"a rollout of ModelDeployment {request.ref.namespace}/{request.ref.name} "
                f"runs only as a child of {own!r}; this one has {by}"
            )
        return None

    @workflow.run
    async def run(self, request: RolloutInput) -> RolloutResult:
        self._next_ordinal = request.next_ordinal
        try:
            return await self._converge(request)
        except ActivityError as error:
            refused = permanent_failure(error)
            if refused is None:
                raise
            self._status.doing = "stopped"
            self._status.last_error = f"{refused.type}: {refused.message}"
            return RolloutResult(
                converged=False,
                next_ordinal=self._next_ordinal,
                ready=self._step.ready if self._step else 0,
                replicas=self._step.replicas if self._step else 0,
                reason=refused.type or "Refused",
                message=refused.message,
                permanent=True,
            )

    async def _converge(self, request: RolloutInput) -> RolloutResult:
        ref, fingerprint = request.ref, request.template.fingerprint()
        deadline = workflow.now() + timedelta(seconds=request.deadline_s)
        failed: dict[str, str] = {}
        observed = request.observed
        while True:
            pods = observed if observed is not None else await list_pods(ref)
            observed = None
            self._next_ordinal = max([self._next_ordinal, *(p.ordinal + 1 for p in pods)])
            step = self._step = plan_rollout(
                pods=pods,
                fingerprint=fingerprint,
                desired=request.desired,
                next_ordinal=self._next_ordinal,
            )
            for pod in pods:
                # a lost node is not the runtime failing
                if pod.name in step.remove and pod.fingerprint == fingerprint and not pod.node_lost:
                    failed[pod.name] = pod.exit_reason or pod.phase
            if len(failed) >= MAX_FAILED_PODS:
                last = sorted(failed.items())[-1]
                return RolloutResult(
                    converged=False,
                    next_ordinal=self._next_ordinal,
                    ready=step.ready,
                    replicas=step.replicas,
                    reason="RuntimeFailed",
                    message=f"{len(failed)} pods of this template stopped; last: {last[0]}: {last[1]}",
                )
            lost = {pod.name for pod in pods if pod.node_lost}
            for name in step.remove:
                await call_kube(
                    ServingPodActivities.delete_pod,
                    PodName(namespace=ref.namespace, name=name, force=name in lost),
                )
            for ordinal in step.create:
                await call_kube(
                    ServingPodActivities.create_pod,
                    CreatePod(ref=ref, template=request.template, ordinal=ordinal),
                )
                self._next_ordinal = max(self._next_ordinal, ordinal + 1)
            for name in step.drain:
                await start_drain(
                    cluster=ref.cluster,
                    namespace=ref.namespace,
                    pod=name,
                    timeout_s=request.template.plan.drain_timeout_s,
                )
            if step.converged:
                return RolloutResult(
                    converged=True,
                    next_ordinal=self._next_ordinal,
                    ready=step.ready,
                    replicas=step.replicas,
                )
            if workflow.now() >= deadline:
                stuck = [p.name for p in pods if p.unschedulable]
                return RolloutResult(
                    converged=False,
                    next_ordinal=self._next_ordinal,
                    ready=step.ready,
                    replicas=step.replicas,
                    reason="Unschedulable" if stuck else "ProgressDeadlineExceeded",
                    message=f"{step.waiting_for}"
                    + (f"; unschedulable: {', '.join(stuck)}" if stuck else ""),
                )
            self._status.doing = step.waiting_for or "converging"
            await workflow.sleep(ROUND_INTERVAL)


async def start_drain(*, cluster: str, namespace: str, pod: str, timeout_s: float) -> None:
    """Start `drain/<ns>/<pod>` (of the caller's cluster) unless it is already running;
    it outlives the caller."""
    with contextlib.suppress(WorkflowAlreadyStartedError):
        await workflow.start_child_workflow(
            DrainWorkflow.run,
            DrainInput(namespace=namespace, pod=pod, timeout_s=timeout_s),
            id=drain_workflow_id(cluster=cluster, namespace=namespace, pod=pod),
            task_queue=workflow.info().task_queue,
            parent_close_policy=ParentClosePolicy.ABANDON,
            search_attributes=workflow.info().typed_search_attributes,
        )


async def list_pods(ref: ObjectRef) -> list[ObservedPod]:
    """The serving pods of the ModelDeployment `ref`, as they are now."""
    return await call_kube(
        ServingPodActivities.list_pods, PodsRequest(namespace=ref.namespace, deployment=ref.name)
    )


async def roll_out(
    request: RolloutInput,
    *,
    number: int,
    started: Callable[[], Awaitable[None]],
    moved: Callable[[], bool],
) -> RolloutResult | None:
    """Run rollout `number` of a deployment as a child; `started` runs once the child
    is started, and the child is cancelled as soon as `moved()` (a newer spec asks
    for something else). Its result; None when cancelled."""
    handle = await workflow.start_child_workflow(
        RolloutWorkflow.run,
        request,
        id=rollout_workflow_id(request.ref, number=number),
        task_queue=workflow.info().task_queue,
        search_attributes=workflow.info().typed_search_attributes,
    )
    await started()
    await workflow.wait_condition(lambda: handle.done() or moved(), timeout=None)
    if not handle.done():
        handle.cancel()
    try:
        return await handle
    except ChildWorkflowError:
        return None  # cancelled for a newer spec: the next pass starts over
