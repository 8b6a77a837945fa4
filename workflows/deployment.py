"""DeploymentWorkflow: the entity workflow of one ModelDeployment
(`deployment/<ns>/<name>/<uid>`). It only orchestrates; the decisions are pure code.

Started and nudged by the watcher with the latest spec; nudged again when its pods
or its artifact change, woken by a gateway holding a request at zero, told the demand
by the gateways. Each pass gathers facts and acts on what is decided from them: the
plan (`workflows.deployment_planning`), the replica count (`kama.replica_keeper`:
wake, demand scaling, idle-to-minimum, `kubectl scale`, the KEDA stand-back, the
idle clock), the pods (`workflows.deployment_rollout`), the status
(`kama.deployment_status`: typed, written only when it changed, Events on
transitions). Deletion drains every pod first (`workflows.deployment_deletion`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow

from workflows.deployment_deletion import delete_deployment
from workflows.deployment_planning import PlanVerdict, plan_deployment
from workflows.drain import replica_busy
from workflows.entity import EntityWorkflow, Rest
from workflows.keda_handoff import KedaHandoff, keep_handoff
from workflows.kube_calls import call_kube

with workflow.unsafe.imports_passed_through():
    # the payload converter resolves the memory's nested dataclasses (the demand
    # ledger's) through the sandbox's sys.modules: import their module here
    import kama.demand_ledger  # noqa: F401
    from activities.kube import KubeActivities
    from activities.serving_pods import ScaleRequest, ServingPodActivities
    from kama.api.deployment import DeploymentCondition, ModelDeploymentSpec, ModelDeploymentStatus
    from kama.conditions import ConditionUpdate, rfc3339
    from kama.contracts import (
        ARTIFACT_CHANGED,
        DEMAND,
        DEPLOYMENTS,
        PODS_CHANGED,
        STATUS_QUERY,
        WAKE,
        DemandReport,
        DeploymentWorkflowStatus,
        EntitySnapshot,
        ObjectRef,
        deployment_workflow_id,
    )
    from kama.deployment_status import (
        condition_events,
        next_status,
        replica_conditions,
        replica_counts,
        replica_fields,
        wire,
    )
    from kama.durations import parse_duration
    from kama.replica_keeper import (
        ReplicaBounds,
        ReplicaFacts,
        ReplicaKeeper,
        ReplicaMemory,
        desired_replicas,
        replica_bounds,
        rollout_outdated,
    )
    from kama.rollout import ObservedPod
    from kama.serving_pod import ServingTemplate
    from workflows.deployment_rollout import RESYNC, RolloutMemory, keep_rollout
    from workflows.rollout import list_pods

DEFAULT_RUNTIME_IMAGE = "ghcr.io/kama-dev/kama:0.1.0"


@dataclass
class DeploymentMemory:
    """State carried across continue-as-new."""

    status: dict[str, Any] = field(default_factory=dict)  # as last written
    template: ServingTemplate | None = None
    pending_fields: dict[str, Any] = field(default_factory=dict)  # ride with the next write
    rollout: RolloutMemory = field(default_factory=RolloutMemory)
    replicas: ReplicaMemory = field(default_factory=ReplicaMemory)
    keda: KedaHandoff = field(default_factory=KedaHandoff)  # KEDA mode's ScaledObject


@dataclass(frozen=True)
class DeploymentInput:
    snapshot: EntitySnapshot
    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    memory: DeploymentMemory = field(default_factory=DeploymentMemory)


@workflow.defn(name="Keep model deployment")
class DeploymentWorkflow(EntityWorkflow):
    plural = DEPLOYMENTS
    kind = "ModelDeployment"

    @staticmethod
    def workflow_id_for(ref: ObjectRef) -> str:
        return deployment_workflow_id(ref)

    @staticmethod
    def carries_memory(request: DeploymentInput) -> bool:
        return bool(request.memory != DeploymentMemory())

    def __init__(self) -> None:
        super().__init__()
        self._memory = DeploymentMemory()
        self._keeper = ReplicaKeeper(self._memory.replicas)
        self._image = DEFAULT_RUNTIME_IMAGE
        self._dirty = True  # something to act on: a new spec, the artifact, a wake
        self._nudged = False  # something to look at: pod events, the same spec, demand
        self._pausing = False  # after a failed rollout: only `_dirty` ends the pause
        self._replan = True
        self._wake = False
        self._events_sent: list[workflow.ActivityHandle[None]] = []  # off the critical path

    # signals and queries ------------------------------------------------------

    def _took(self, snapshot: EntitySnapshot, *, previous: EntitySnapshot | None) -> None:
        new_spec = previous is None or snapshot.generation != previous.generation
        self._replan = self._replan or new_spec
        if new_spec or previous is None or snapshot.deleting != previous.deleting:
            self._dirty = True
        else:  # the watcher saw a status or metadata change (often our own write)
            self._nudged = True

    @workflow.signal(name=PODS_CHANGED)
    def pods_changed(self) -> None:
        self._nudged = True

    @workflow.signal(name=ARTIFACT_CHANGED)
    def artifact_changed(self) -> None:
        self._replan = self._dirty = True

    @workflow.signal(name=WAKE)
    def wake(self) -> None:
        self._wake = self._dirty = True

    @workflow.signal(name=DEMAND)
    def demand(self, report: DemandReport) -> None:
        if self._keeper.reported(
            gateway=report.gateway,
            demand=report.demand,
            busy_pods=[pod for pod, count in report.pods.items() if count > 0],
            risen_for=timedelta(seconds=report.risen_for_s),
            now=workflow.now(),
        ):
            self._nudged = True

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> DeploymentWorkflowStatus:
        found, replicas = self._memory.status, self._memory.replicas
        return self._answer(
            DeploymentWorkflowStatus(
                fingerprint=found.get("fingerprint"),
                profile=found.get("profile"),
                replicas=found.get("replicas", 0),
                ready_replicas=found.get("readyReplicas", 0),
                last_demand=replicas.wanted_at,
                demand=replicas.demand.total(),
                autoscaler="KEDA" if self._memory.keda.in_effect else "Kama",
                last_error=self._memory.rollout.failure,
            )
        )

    # main loop ----------------------------------------------------------------

    @workflow.run
    async def run(self, request: DeploymentInput) -> None:
        self._memory = request.memory
        self._keeper = ReplicaKeeper(self._memory.replicas)
        self._image = request.runtime_image
        await self._keep(request.snapshot)

    async def _reconcile(self, snap: EntitySnapshot, *, retry: bool) -> Rest:
        self._dirty = self._nudged = self._pausing = False
        spec = ModelDeploymentSpec.model_validate(snap.spec)
        if retry or self._replan or self._memory.template is None:
            self._replan = False
            await self._plan(snap, spec)
        news = await keep_handoff(self._memory.keda, snap=snap, spec=spec, retry=retry)
        if news is not None:
            await self._record(snap, type=news.type, reason=news.reason, message=news.message)
        bounds = replica_bounds(spec)
        decision = self._keeper.decide(
            ReplicaFacts(
                generation=snap.generation,
                replicas=spec.replicas,
                bounds=bounds,
                now=workflow.now(),
                wake=self._wake,
                keda=self._memory.keda.in_effect,
            )
        )
        self._wake = False
        desired, look_again = decision.desired, decision.look_again
        scaled: asyncio.Task[None] | None = None
        if decision.scale_to is not None:
            # written beside the rollout: the pods for `desired` need not wait for the
            # write (a pass that fails to write it ends failing, as before; the next
            # pass trims to the spec)
            write = self._scale(snap, decision.scale_to)
            scaled = asyncio.create_task(
                self._scaled(snap, write, replicas=decision.scale_to, why=decision.why)
            )
            if decision.woke:
                self._memory.pending_fields["last_wake"] = rfc3339(workflow.now())
        if decision.ask_replicas:
            desired, look_again = await self._idle_down(snap, bounds, desired=desired)
        wait: timedelta | None = RESYNC
        template = self._memory.template
        if template is not None:
            deadline = parse_duration(spec.scaling.cold_start_timeout)
            outcome = await keep_rollout(
                self._memory.rollout,
                snap=snap,
                template=template,
                desired=desired,
                deadline=deadline,
                retry=retry,
                report=lambda pods: self._write_replicas(
                    snap, desired=desired, pods=pods, fingerprint=template.fingerprint()
                ),
                moved=lambda: self._spec_moved(snap, desired),
                doing=self._say,
            )
            wait, self._doing, self._pausing = outcome.wait, outcome.doing, outcome.pausing
        if scaled is not None:
            await scaled
        if look_again is not None:
            wait = look_again if wait is None else min(wait, look_again)
        await self._events_recorded()
        return Rest(timeout=wait)

    def _woken(self, snap: EntitySnapshot) -> bool:
        """Pod events, echoes of the same spec and a change in demand start another
        pass, except in the pause after a failed rollout (a crashing runtime would be
        recreated at once)."""
        return self._dirty or (self._nudged and not self._pausing)

    def _rested(self) -> None:
        self._replan = self._memory.template is None

    def _carried_over(self) -> DeploymentInput:
        assert self._snapshot is not None
        return DeploymentInput(
            snapshot=self._snapshot, runtime_image=self._image, memory=self._memory
        )

    async def _report(self, snap: EntitySnapshot, *, reason: str, message: str) -> None:
        await self._write(snap, [(DeploymentCondition.RUNTIME_READY, False, reason, message)])
        await self._events_recorded()

    # planning and replicas ----------------------------------------------------

    async def _plan(self, snap: EntitySnapshot, spec: ModelDeploymentSpec) -> None:
        self._doing = "reading the artifact and the nodes"
        outcome = await plan_deployment(snap=snap, spec=spec, image=self._image)
        if outcome.verdict is PlanVerdict.FIT_FAILED:
            self._memory.template = None
        elif outcome.verdict is PlanVerdict.PLACED:
            if outcome.template != self._memory.template:
                self._memory.rollout.failure = None
            self._memory.template = outcome.template
        if self._memory.template is None:
            self._doing = {
                PlanVerdict.WAITING: "waiting for the artifact",
                PlanVerdict.UNUSABLE: "waiting for a usable artifact",
                PlanVerdict.FIT_FAILED: "waiting for a spec or nodes it fits",
            }.get(outcome.verdict, self._doing)
        await self._write(snap, outcome.conditions, fields=outcome.fields)

    async def _set_replicas(self, snap: EntitySnapshot, replicas: int, why: str) -> None:
        await self._scaled(snap, self._scale(snap, replicas), replicas=replicas, why=why)

    def _scale(self, snap: EntitySnapshot, replicas: int) -> workflow.ActivityHandle[None]:
        """Start writing `spec.replicas` (the `/scale` subresource)."""
        return call_kube(
            ServingPodActivities.set_replicas, ScaleRequest(ref=snap.ref, replicas=replicas)
        )

    async def _scaled(
        self, snap: EntitySnapshot, write: workflow.ActivityHandle[None], *, replicas: int, why: str
    ) -> None:
        """Once `write` (`_scale`) is done, its Event."""
        await write
        await self._record(
            snap, type="Normal", reason="Scaled", message=f"spec.replicas set to {replicas}: {why}"
        )

    async def _idle_down(
        self, snap: EntitySnapshot, bounds: ReplicaBounds, *, desired: int
    ) -> tuple[int, timedelta | None]:
        """Idle by every clock: down to the floor unless a replica is busy after all."""
        pods = await list_pods(snap.ref)
        if await replica_busy(namespace=snap.ref.namespace, pods=pods):
            return desired, self._keeper.busy(now=workflow.now(), bounds=bounds)
        floor, why = self._keeper.idle_floor(bounds)
        await self._set_replicas(snap, floor, why)
        return desired_replicas(replicas=floor, bounds=bounds), None

    # converging ---------------------------------------------------------------

    def _spec_moved(self, rolling: EntitySnapshot, desired: int) -> bool:
        snap = self._snapshot
        if snap is None or snap.deleting:
            return True
        return snap.generation != rolling.generation and rollout_outdated(
            rolling=rolling.spec, newest=snap.spec, desired=desired
        )

    async def _write_replicas(
        self, snap: EntitySnapshot, *, desired: int, pods: list[ObservedPod], fingerprint: str
    ) -> None:
        counts = replica_counts(pods=pods, fingerprint=fingerprint, desired=desired)
        self._keeper.routable(count=counts.routable, now=workflow.now())
        conditions = replica_conditions(counts, failure=self._memory.rollout.failure)
        await self._write(snap, conditions, fields=replica_fields(counts))

    # deletion -----------------------------------------------------------------

    async def _finalize(self, snap: EntitySnapshot) -> None:
        await delete_deployment(snap, doing=self._say, carry_over=self._carried_over)
        await self._events_recorded()

    def _say(self, doing: str) -> None:
        self._doing = doing

    # status -------------------------------------------------------------------

    async def _write(
        self,
        snap: EntitySnapshot,
        conditions: list[ConditionUpdate],
        *,
        fields: dict[str, Any] | None = None,
    ) -> None:
        """Write the status these decisions make of the last one, if it changed; an
        Event for each transition worth one."""
        written = self._memory.status
        status = wire(
            next_status(
                ModelDeploymentStatus.model_validate(written),
                conditions=conditions,
                fields={**self._memory.pending_fields, **(fields or {})},
                now=workflow.now(),
                generation=snap.generation,
            )
        )
        if not await self._write_status(snap, written=written, status=status):
            return
        self._memory.status, self._memory.pending_fields = status, {}
        for event in condition_events(written.get("conditions", []), status["conditions"]):
            await self._record(snap, type=event.type, reason=event.reason, message=event.message)

    async def _record(self, snap: EntitySnapshot, *, type: str, reason: str, message: str) -> None:
        """Record an Event in the background (the loop waits for all of them before it
        rests), so a wake's scale-up does not wait for its own Event."""
        event = self._event(snap, type=type, reason=reason, message=message)
        self._events_sent.append(call_kube(KubeActivities.record_event, event))

    async def _events_recorded(self) -> None:
        sent, self._events_sent = self._events_sent, []
        for event in sent:
            await event
