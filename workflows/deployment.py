"""DeploymentWorkflow: the entity workflow of one ModelDeployment
(`deployment/<ns>/<name>/<uid>`).

Started and nudged by the watcher with the latest spec; nudged again when its pods
or its artifact change. Each pass: wait for the artifact to be Ready, plan the
placement (pure, from the artifact's GGUF facts and the nodes), and converge the
pods onto the resulting template with a RolloutWorkflow child (new pods ready
before old ones drain; dead pods replaced). A rollout that gives up (pods crash, the
deadline passes) is tried again after RETRY_FAILED_ROLLOUT, a pause that pod events
and the watcher's echoes do not cut short (a new spec, the artifact, a wake or `retry`
do). Status and conditions say what was decided and why, `Ready` summing them up for
`kubectl wait` and health checks; Events mark transitions. On deletion every pod is
drained, then the finalizer is released; the artifact is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ChildWorkflowError

from workflows.drain import SLOTS
from workflows.entity import HISTORY_LIMIT, EntityWorkflow, Rest
from workflows.keda_handoff import KedaHandoff, keep_handoff
from workflows.kube_calls import call_kube
from workflows.polling import poll_interval

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from activities.kube import FinalizerRequest, KubeActivities
    from activities.llama_server import LlamaServerActivities, SlotsRequest
    from activities.serving_pods import (
        InputsRequest,
        PodsRequest,
        ScaleRequest,
        ServingPodActivities,
    )
    from kama.api import ModelArtifactStatus
    from kama.api.deployment import DeploymentCondition, ModelDeploymentSpec, Scaling
    from kama.conditions import (
        Conditions,
        ConditionUpdate,
        condition_status,
        rfc3339,
        set_conditions,
        updated_status,
    )
    from kama.contracts import (
        ARTIFACT_CHANGED,
        DEMAND,
        DEPLOYMENTS,
        PODS_CHANGED,
        STATUS_QUERY,
        WAKE,
        DemandReport,
        EntitySnapshot,
        WorkflowStatus,
        rollout_workflow_id,
    )
    from kama.demand_ledger import DemandLedger, scaling_rule, stale_after
    from kama.deployment_plan import (
        SCALED_TO_ZERO,
        ArtifactNotUsable,
        decide_deployment,
        degraded_condition,
        describe_profile,
        headline_reason,
        ready_condition,
    )
    from kama.durations import parse_duration
    from kama.rollout import ObservedPod
    from kama.serving_pod import ServingTemplate, serving_selector
    from workflows.rollout import RolloutInput, RolloutResult, RolloutWorkflow, start_drain

RESYNC = timedelta(minutes=5)
RETRY_FAILED_ROLLOUT = timedelta(seconds=30)
DELETE_POLL = timedelta(seconds=2)
DELETE_POLL_MAX = timedelta(seconds=60)
DELETE_POLLS_AT_FIRST_PACE = 30
"""Deleting: pods are listed every 2 s for the first minute (drains end in seconds),
then less often up to once a minute (a pod stuck terminating can take hours)."""
DEFAULT_RUNTIME_IMAGE = "ghcr.io/kama-dev/kama:0.1.0"

C = DeploymentCondition
WARNING_WHEN_TRUE = {C.FIT_FAILED, C.DEGRADED}
EVENT_CONDITIONS = (
    C.ARTIFACT_READY,
    C.PLACED,
    C.FIT_FAILED,
    C.DEGRADED,
    C.RUNTIME_READY,
    C.SERVING,
)


@dataclass
class DeploymentMemory:
    """State carried across continue-as-new."""

    status: dict[str, Any] = field(default_factory=dict)
    template: ServingTemplate | None = None
    planned_generation: int | None = None
    planned_artifact: str | None = None
    next_ordinal: int = 0
    rollout_failure: str | None = None  # "Reason: message" of the last failed rollout
    rollouts: int = 0
    last_demand: str | None = None  # ISO time of the last request any gateway reported
    seen_replicas: int = 0  # a scale-up (by anyone) restarts the idle clock
    seen_routable: int = 0  # and so does a replica becoming ready to serve
    woke_at_generation: int | None = None  # a wake scale-up not yet seen back in the spec
    status_to_add: dict[str, Any] = field(default_factory=dict)  # rides with the next write
    # "<generation>/<fingerprint>" of a rollout the API server refused (a missing
    # permission): not tried again before a spec change or a `retry` signal
    refused_rollout: str | None = None
    demand: DemandLedger = field(default_factory=DemandLedger)
    autoscaled_at_generation: int | None = None  # our scale not yet seen back in the spec
    keda: KedaHandoff = field(default_factory=KedaHandoff)  # KEDA mode's ScaledObject


# workflow.patched() markers; a history written before a change replays its old path.
# Events in the background, lastWake with the next status write, the rollout started
# before the status write:
WAKE_CRITICAL_PATH = "wake-critical-path-1"
# after a failed rollout, pod events and status echoes no longer cut the pause short:
PAUSE_AFTER_FAILED_ROLLOUT = "pause-after-failed-rollout-1"
# a claim one node at a time can mount keeps every replica on one node:
ONE_NODE_CLAIMS = "one-node-claims-1"
# memory estimated for real architectures (logits per slot, sliding windows, recurrent
# state, vocabulary); decisions recorded before replay with the old estimator:
MEMORY_ESTIMATE_2 = "memory-estimate-2"
# a status that differs only by the Ready condition (carried over from code without
# it) is written:
READY_ALONE = "ready-condition-1"
# demand scales between minReplicas and maxReplicas (asked once, at the start of a run):
AUTOSCALING = "demand-autoscaling-1"
# the idle scale-down waits while a gateway's latest report, late but not stale, says
# requests are in flight:
IDLE_HEEDS_REPORTED_DEMAND = "idle-heeds-reported-demand-1"
# the idle clock restarts when a replica becomes routable (a replica that loaded for
# most of idleTimeout is not scaled away the moment it is ready):
IDLE_CLOCK_FROM_SERVING = "idle-clock-from-serving-1"
# the next scaling decision waits exactly until its window closes (at least
# DECISION_WAIT_FLOOR, was a whole second), so a rise dated from its arrival
# scales when its window ends:
DECISION_AT_WINDOW_END = "decision-at-window-end-1"
DECISION_WAIT_FLOOR = timedelta(milliseconds=50)
LEGACY_DECISION_WAIT_FLOOR = timedelta(seconds=1)


@dataclass(frozen=True)
class DeploymentInput:
    snapshot: EntitySnapshot
    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    memory: DeploymentMemory = field(default_factory=DeploymentMemory)


@dataclass
class DeploymentWorkflowStatus(WorkflowStatus):
    """The `status` answer of a DeploymentWorkflow."""

    fingerprint: str | None = None
    profile: dict[str, Any] | None = None
    replicas: int = 0
    ready_replicas: int = 0
    last_demand: str | None = None
    demand: int = 0  # requests in flight or queued, over every gateway
    autoscaler: str = "Kama"  # who sets spec.replicas from demand now: Kama or KEDA


@workflow.defn(name="Keep model deployment")
class DeploymentWorkflow(EntityWorkflow):
    plural = DEPLOYMENTS
    kind = "ModelDeployment"

    def __init__(self) -> None:
        super().__init__()
        self._memory = DeploymentMemory()
        self._image = DEFAULT_RUNTIME_IMAGE
        self._dirty = True  # something to act on: a new spec, the artifact, a wake
        self._nudged = False  # something to look at: pod events, the same spec again
        self._pausing = False  # after a failed rollout: only `_dirty` ends the pause
        self._replan = True
        self._wake = False
        self._autoscaling = False  # whether this run may scale on demand (a patch)
        self._demand_changed = False
        # Events, off the critical path
        self._events_sent: list[workflow.ActivityHandle[None]] = []

    # signals and queries ------------------------------------------------------

    def _took(self, snapshot: EntitySnapshot, *, previous: EntitySnapshot | None) -> None:
        new_spec = previous is None or snapshot.generation != previous.generation
        if new_spec:
            self._replan = True
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
        now = workflow.now()
        self._memory.last_demand = now.isoformat()
        busy = [pod for pod, count in report.pods.items() if count > 0]
        if self._memory.demand.record(
            gateway=report.gateway,
            demand=report.demand,
            busy_pods=busy,
            now=now,
            risen_for=timedelta(seconds=report.risen_for_s),
        ):
            self._demand_changed = True

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> DeploymentWorkflowStatus:
        found = self._memory.status
        return self._answer(
            DeploymentWorkflowStatus(
                fingerprint=found.get("fingerprint"),
                profile=found.get("profile"),
                replicas=found.get("replicas", 0),
                ready_replicas=found.get("readyReplicas", 0),
                last_demand=self._memory.last_demand,
                demand=self._memory.demand.total(),
                autoscaler="KEDA" if self._memory.keda.in_effect else "Kama",
                last_error=self._memory.rollout_failure,
            )
        )

    # main loop ----------------------------------------------------------------

    @workflow.run
    async def run(self, request: DeploymentInput) -> None:
        self._memory = request.memory
        self._image = request.runtime_image
        self._autoscaling = workflow.patched(AUTOSCALING)
        await self._keep(request.snapshot)

    async def _reconcile(self, snap: EntitySnapshot, *, retry: bool) -> Rest:
        self._dirty = self._nudged = self._pausing = self._demand_changed = False
        spec = ModelDeploymentSpec.model_validate(snap.spec)
        if retry or self._replan or self._memory.template is None:
            self._replan = False
            await self._plan(snap, spec)
        if spec.replicas > self._memory.seen_replicas:
            self._memory.last_demand = workflow.now().isoformat()
        if spec.replicas != self._memory.seen_replicas and self._autoscaling:
            self._memory.demand.scaled(now=workflow.now())
        self._memory.seen_replicas = spec.replicas
        keda = await self._keda_owns_replicas(snap, spec, retry=retry)
        if self._wake:
            self._wake = False
            if keda:  # the held request reaches KEDA through the gateway's scaler
                self._memory.last_demand = workflow.now().isoformat()
            else:
                spec = await self._scale_for_wake(snap, spec)
        wait: timedelta | None = RESYNC
        scale_in: timedelta | None = None
        if self._autoscaling and not keda:
            spec, scale_in = await self._autoscale(snap, spec)
        template = self._memory.template
        if template is not None:
            rollout = f"{snap.generation}/{template.fingerprint()}"
            result: RolloutResult | None = None
            if retry or self._memory.refused_rollout != rollout:
                result = await self._converge(snap, spec, template)
                permanent = result is not None and result.permanent
                self._memory.refused_rollout = rollout if permanent else None
            refused = self._memory.refused_rollout == rollout
            wait, self._doing = _next_pass(result, refused=refused)
            failed = result is not None and not result.converged and not refused
            self._pausing = failed and workflow.patched(PAUSE_AFTER_FAILED_ROLLOUT)
        if keda:
            idle_in = self._expire_for_keda(spec)
        else:
            idle_in = await self._scale_down_when_idle(snap, spec)
        for due in (idle_in, scale_in):
            if due is not None:
                wait = due if wait is None else min(wait, due)
        await self._events_recorded()
        return Rest(timeout=wait)

    def _woken(self, snap: EntitySnapshot) -> bool:
        """Pod events and echoes of the same spec start another pass, except in the
        pause after a failed rollout (a crashing runtime would be recreated at once);
        so does a change in demand, which may scale."""
        nudged = self._nudged or (self._demand_changed and self._autoscaling)
        return self._dirty or (nudged and not self._pausing)

    def _rested(self) -> None:
        self._replan = self._memory.template is None

    def _carried_over(self) -> DeploymentInput:
        assert self._snapshot is not None
        return DeploymentInput(
            snapshot=self._snapshot, runtime_image=self._image, memory=self._memory
        )

    async def _report(self, snap: EntitySnapshot, *, reason: str, message: str) -> None:
        await self._write(snap, extra={}, conditions=[(C.RUNTIME_READY, False, reason, message)])
        await self._events_recorded()

    # planning -----------------------------------------------------------------

    async def _plan(self, snap: EntitySnapshot, spec: ModelDeploymentSpec) -> None:
        self._doing = "reading the artifact and the nodes"
        inputs = await call_kube(
            ServingPodActivities.read_inputs,
            InputsRequest(namespace=snap.ref.namespace, artifact=spec.model_ref.name),
        )
        artifact = (
            ModelArtifactStatus.model_validate(inputs.artifact_status)
            if inputs.artifact_status is not None
            else None
        )
        ready = (
            artifact is not None
            and condition_status(
                [c.model_dump(by_alias=True) for c in artifact.conditions], "Ready"
            )
            == "True"
        )
        if artifact is None or not ready:
            why = (
                f"ModelArtifact {spec.model_ref.name} does not exist"
                if artifact is None
                else f"ModelArtifact {spec.model_ref.name} is not Ready"
                f" (phase {artifact.phase or 'unknown'})"
            )
            await self._write(
                snap,
                extra={},
                conditions=[(C.ARTIFACT_READY, False, "ArtifactNotReady", why)],
            )
            if self._memory.template is None:
                self._doing = "waiting for the artifact"
            return
        assert artifact is not None
        try:
            decision = decide_deployment(
                spec=spec,
                artifact=artifact,
                nodes=inputs.nodes,
                image=self._image,
                claim_nodes=inputs.claim_nodes,
                one_node_claims=workflow.patched(ONE_NODE_CLAIMS),
                legacy_estimate=not workflow.patched(MEMORY_ESTIMATE_2),
            )
        except ArtifactNotUsable as exc:
            self._doing = "waiting for a usable artifact"
            await self._write(
                snap,
                extra={},
                conditions=[(C.ARTIFACT_READY, False, "ArtifactNotUsable", str(exc))],
            )
            return
        artifact_ok = (C.ARTIFACT_READY, True, "Ready", f"serving {artifact.manifest_digest}")
        if decision.template is None:
            message = decision.plan.fit_failed_message or "no candidate fits"
            self._doing = "waiting for a spec or nodes it fits"
            await self._write(
                snap,
                extra={"profile": None, "rejectedCandidates": decision.rejected},
                conditions=[
                    artifact_ok,
                    (C.PLACED, False, "FitFailed", message),
                    (C.FIT_FAILED, True, "FitFailed", message),
                ],
            )
            self._memory.template = None
            self._memory.planned_generation = snap.generation
            return
        selected = decision.plan.selected
        assert selected is not None
        template = decision.template
        if template != self._memory.template:
            self._memory.rollout_failure = None
        self._memory.template = template
        self._memory.planned_generation = snap.generation
        self._memory.planned_artifact = artifact.manifest_digest
        await self._write(
            snap,
            extra={
                "profile": decision.profile,
                "rejectedCandidates": decision.rejected,
                "artifactDigest": artifact.manifest_digest,
                "runtimeImage": template.image,
                "fingerprint": template.fingerprint(),
                "selector": serving_selector(snap.ref.name),
            },
            conditions=[
                artifact_ok,
                (C.PLACED, True, selected.decision, describe_profile(selected)),
                (C.FIT_FAILED, False, "Fits", describe_profile(selected)),
                degraded_condition(profile=selected, asked=spec.placement.mode),
            ],
        )

    # converging ---------------------------------------------------------------

    def _desired(self, spec: ModelDeploymentSpec) -> int:
        return max(spec.scaling.min_replicas, min(spec.replicas, spec.scaling.max_replicas))

    async def _pods(self, snap: EntitySnapshot) -> list[ObservedPod]:
        return await call_kube(
            ServingPodActivities.list_pods,
            PodsRequest(namespace=snap.ref.namespace, deployment=snap.ref.name),
        )

    async def _converge(
        self, snap: EntitySnapshot, spec: ModelDeploymentSpec, template: ServingTemplate
    ) -> RolloutResult | None:
        """Roll out `template` unless the pods are settled on it; the rollout's result
        (None: nothing to do, or a newer spec cancelled it)."""
        desired = self._desired(spec)
        fingerprint = template.fingerprint()
        pods = await self._pods(snap)
        current = [p for p in pods if p.fingerprint == fingerprint and p.serving]
        settled = (
            len(current) == desired
            and all(p.ready for p in current)
            and not any(p.serving and p.fingerprint != fingerprint for p in pods)
            and not any(p.terminal and not p.deleting for p in pods)
        )
        result: RolloutResult | None = None
        if not settled:
            self._doing = f"rolling out {fingerprint} to {desired} replica(s)"
            rollout_first = workflow.patched(WAKE_CRITICAL_PATH)
            if not rollout_first:
                await self._write_replicas(
                    snap, desired=desired, pods=pods, fingerprint=fingerprint
                )
            self._memory.rollouts += 1
            handle = await workflow.start_child_workflow(
                RolloutWorkflow.run,
                RolloutInput(
                    ref=snap.ref,
                    template=template,
                    desired=desired,
                    next_ordinal=self._memory.next_ordinal,
                    deadline_s=parse_duration(spec.scaling.cold_start_timeout).total_seconds(),
                    observed=pods if rollout_first else None,
                ),
                id=rollout_workflow_id(snap.ref, number=self._memory.rollouts),
                task_queue=workflow.info().task_queue,
                search_attributes=workflow.info().typed_search_attributes,
            )
            if rollout_first:
                await self._write_replicas(
                    snap, desired=desired, pods=pods, fingerprint=fingerprint
                )
            await workflow.wait_condition(
                lambda: handle.done() or self._spec_moved(snap, desired), timeout=None
            )
            if not handle.done():
                handle.cancel()
            try:
                result = await handle
            except ChildWorkflowError:
                result = None  # cancelled for a newer spec: the next pass starts over
            if result is not None:
                self._memory.next_ordinal = max(self._memory.next_ordinal, result.next_ordinal)
                self._memory.rollout_failure = (
                    None if result.converged else f"{result.reason}: {result.message}"
                )
            pods = await self._pods(snap)
        else:
            self._memory.rollout_failure = None
        await self._write_replicas(snap, desired=desired, pods=pods, fingerprint=fingerprint)
        return result

    def _spec_moved(self, rolling: EntitySnapshot, desired: int) -> bool:
        """A newer spec asks for something else than the running rollout (a replica
        count equal to the one being rolled out, as after a wake, is not a change)."""
        snap = self._snapshot
        if snap is None or snap.deleting:
            return True
        if snap.generation == rolling.generation:
            return False
        others = {k: v for k, v in snap.spec.items() if k != "replicas"}
        return others != {k: v for k, v in rolling.spec.items() if k != "replicas"} or (
            self._desired(ModelDeploymentSpec.model_validate(snap.spec)) != desired
        )

    async def _write_replicas(
        self, snap: EntitySnapshot, *, desired: int, pods: list[ObservedPod], fingerprint: str
    ) -> None:
        current = [p for p in pods if p.fingerprint == fingerprint and p.serving]
        routable = [p for p in pods if p.ready and p.serving]
        if len(routable) > self._memory.seen_routable and workflow.patched(IDLE_CLOCK_FROM_SERVING):
            self._memory.last_demand = workflow.now().isoformat()
        self._memory.seen_routable = len(routable)
        ready = sum(1 for p in current if p.ready)
        failure = self._memory.rollout_failure
        if failure:
            reason, _, message = failure.partition(": ")
            runtime = (C.RUNTIME_READY, False, reason, message)
        elif desired == 0:
            runtime = (C.RUNTIME_READY, False, SCALED_TO_ZERO, "no replica is wanted")
        elif ready >= desired:
            runtime = (C.RUNTIME_READY, True, "AllReplicasReady", f"{ready}/{desired} ready")
        else:
            runtime = (C.RUNTIME_READY, False, "Starting", f"{ready}/{desired} ready")
        await self._write(
            snap,
            extra={
                "replicas": len(current),
                "readyReplicas": ready,
                "ready": f"{ready}/{desired}",
                "endpoints": len(routable),
            },
            conditions=[
                runtime,
                (
                    C.SERVING,
                    bool(routable),
                    "Endpoints" if routable else "NoEndpoints",
                    f"{len(routable)} pod(s) accept requests",
                ),
                (
                    C.SCALED_TO_ZERO,
                    desired == 0,
                    "ScaledToZero" if desired == 0 else "Scaled",
                    f"spec.replicas is {desired}",
                ),
            ],
        )

    # scale from and to zero ---------------------------------------------------

    async def _keda_owns_replicas(
        self, snap: EntitySnapshot, spec: ModelDeploymentSpec, *, retry: bool
    ) -> bool:
        """Whether KEDA sets spec.replicas now (`workflows.keda_handoff`): then Kama
        neither wakes, nor autoscales, nor idles the model down; it still converges
        the pods to spec.replicas and drains every leaving replica."""
        news = await keep_handoff(self._memory.keda, snap=snap, spec=spec, retry=retry)
        if news is not None:
            await self._record(snap, type=news.type, reason=news.reason, message=news.message)
        return self._memory.keda.in_effect

    def _expire_for_keda(self, spec: ModelDeploymentSpec) -> timedelta | None:
        """KEDA reads the demand from the `status` query: forget the reports of
        gateways gone silent (crashed, scaled in), as the built-in autoscaler does; how
        long until the next look, while some demand is still reported."""
        fresh_for = stale_after(spec)
        self._memory.demand.expire(stale_after=fresh_for, now=workflow.now())
        return fresh_for if self._memory.demand.total() > 0 else None

    def _idle_since(self) -> datetime:
        if self._memory.last_demand is None:
            self._memory.last_demand = workflow.now().isoformat()
        return datetime.fromisoformat(self._memory.last_demand)

    async def _set_replicas(self, snap: EntitySnapshot, replicas: int, why: str) -> None:
        await call_kube(
            ServingPodActivities.set_replicas, ScaleRequest(ref=snap.ref, replicas=replicas)
        )
        await self._record(
            snap, type="Normal", reason="Scaled", message=f"spec.replicas set to {replicas}: {why}"
        )

    async def _scale_for_wake(
        self, snap: EntitySnapshot, spec: ModelDeploymentSpec
    ) -> ModelDeploymentSpec:
        """Scale up for a waiting request; the spec to converge to now (without waiting
        for the watch to bring the new replica count back)."""
        self._memory.last_demand = workflow.now().isoformat()
        wanted = max(1, spec.scaling.min_replicas)
        if spec.replicas >= wanted:
            return spec
        if self._memory.woke_at_generation == snap.generation:  # our write is on its way
            return spec.model_copy(update={"replicas": wanted})
        self._memory.woke_at_generation = snap.generation
        await self._set_replicas(snap, wanted, "a request arrived while at zero")
        self._memory.seen_replicas = wanted
        if workflow.patched(WAKE_CRITICAL_PATH):
            self._memory.status_to_add["lastWake"] = rfc3339(workflow.now())  # with the next
        else:
            await self._write(snap, extra={"lastWake": rfc3339(workflow.now())}, conditions=[])
        return spec.model_copy(update={"replicas": wanted})

    async def _autoscale(
        self, snap: EntitySnapshot, spec: ModelDeploymentSpec
    ) -> tuple[ModelDeploymentSpec, timedelta | None]:
        """Scale between minReplicas and maxReplicas on demand (`kama.autoscaling`); the
        spec to converge to now, and how long until demand may ask again."""
        now, ledger = workflow.now(), self._memory.demand
        ledger.expire(stale_after=stale_after(spec), now=now)
        if self._memory.autoscaled_at_generation == snap.generation:
            return spec, None  # our last scale is on its way back through the watch
        decision, due = ledger.decide(rule=scaling_rule(spec), current=spec.replicas, now=now)
        floor = (
            DECISION_WAIT_FLOOR
            if workflow.patched(DECISION_AT_WINDOW_END)
            else LEGACY_DECISION_WAIT_FLOOR
        )
        wait = None if due is None else max(due - now, floor)
        if decision is None or decision.replicas == spec.replicas:
            return spec, wait
        await self._set_replicas(snap, decision.replicas, decision.reason)
        self._memory.autoscaled_at_generation = snap.generation
        self._memory.seen_replicas = decision.replicas
        ledger.scaled(now=now)
        return spec.model_copy(update={"replicas": decision.replicas}), wait

    async def _scale_down_when_idle(
        self, snap: EntitySnapshot, spec: ModelDeploymentSpec
    ) -> timedelta | None:
        """Scale to minReplicas after idleTimeout without demand; how long until that
        is due (None when already at the minimum). Busy slots count as demand, so a
        long stream keeps the model up even if no gateway reported it."""
        floor = spec.scaling.min_replicas
        if spec.replicas <= floor:
            return None
        idle_timeout = parse_duration(spec.scaling.idle_timeout)
        due = self._idle_since() + idle_timeout - workflow.now()
        if due > timedelta(0):
            return due
        if workflow.patched(IDLE_HEEDS_REPORTED_DEMAND):
            # a report that is late but not stale still counts: with a short
            # idleTimeout a report period is half of it, and a gateway relaying a
            # stream whose generation has ended holds no slot a probe could see
            ledger, now = self._memory.demand, workflow.now()
            fresh_for = stale_after(spec)
            ledger.expire(stale_after=fresh_for, now=now)
            if ledger.total() > 0:
                return max(min(fresh_for, idle_timeout), timedelta(seconds=1))
        for pod in await self._pods(snap):
            # readiness is not asked: a replica too busy to answer its probe in time
            # is exactly the one that must not be scaled away under its streams
            if pod.pod_ip and not pod.deleting:
                busy = await SLOTS.schedule(
                    LlamaServerActivities.busy_slots,
                    SlotsRequest(namespace=snap.ref.namespace, pod=pod.name),
                )
                # a ready replica that did not answer in time (a busy llama-server on
                # a loaded node) is not known to be idle: look again next round; a
                # dead one turns unready and no longer holds the model up
                if busy or (busy is None and pod.ready):
                    self._memory.last_demand = workflow.now().isoformat()
                    return idle_timeout
        await self._set_replicas(
            snap, floor, f"no request for {spec.scaling.idle_timeout} (idleTimeout)"
        )
        return None

    # deletion -----------------------------------------------------------------

    async def _finalize(self, snap: EntitySnapshot) -> None:
        try:
            drain_timeout = ModelDeploymentSpec.model_validate(snap.spec).scaling.drain_timeout
        except ValidationError:  # a spec that no longer validates must not hold the deletion
            drain_timeout = Scaling().drain_timeout
        timeout_s = parse_duration(drain_timeout).total_seconds()
        polls = 0
        while True:
            if workflow.info().get_current_history_length() > HISTORY_LIMIT:
                workflow.continue_as_new(self._carried_over())  # finalizes again, at once
            pods = await self._pods(snap)
            if not pods:
                break
            self._doing = f"deleting: draining {len(pods)} pod(s)"
            for pod in pods:
                if not pod.deleting:
                    await start_drain(
                        cluster=snap.ref.cluster,
                        namespace=snap.ref.namespace,
                        pod=pod.name,
                        timeout_s=timeout_s,
                    )
            polls += 1
            await workflow.sleep(
                poll_interval(
                    polls=polls,
                    first=DELETE_POLL,
                    maximum=DELETE_POLL_MAX,
                    at_first_pace=DELETE_POLLS_AT_FIRST_PACE,
                )
            )
        await call_kube(
            KubeActivities.release_finalizer, FinalizerRequest(plural=DEPLOYMENTS, ref=snap.ref)
        )
        self._doing = "deleted (the artifact is kept)"
        await self._events_recorded()

    # status -------------------------------------------------------------------

    async def _write(
        self,
        snap: EntitySnapshot,
        *,
        extra: dict[str, Any],
        conditions: list[ConditionUpdate],
    ) -> None:
        before = self._memory.status
        now, generation = workflow.now(), snap.generation
        status = updated_status(
            before,
            conditions,
            fields={**self._memory.status_to_add, **extra},
            now=now,
            generation=generation,
        )
        found = status["conditions"]
        status["conditions"] = set_conditions(
            found, [ready_condition(found)], now=now, generation=generation
        )
        status["reason"] = headline_reason(status["conditions"])
        if _only_ready_differs(before, status) and not workflow.patched(READY_ALONE):
            return  # as code from before Ready decided: nothing new to write
        if not await self._write_status(snap, written=before, status=status):
            return
        self._memory.status = status
        self._memory.status_to_add = {}
        await self._events(
            snap, before=list(before.get("conditions", [])), after=status["conditions"]
        )

    async def _events(self, snap: EntitySnapshot, *, before: Conditions, after: Conditions) -> None:
        for kind in EVENT_CONDITIONS:
            old, new = condition_status(before, kind), condition_status(after, kind)
            if new is None or old == new:
                continue
            entry = next(c for c in after if c["type"] == kind)
            bad = (new == "True") == (kind in WARNING_WHEN_TRUE)
            await self._record(
                snap,
                type="Warning" if bad and not (old is None and new == "False") else "Normal",
                reason=entry["reason"],
                message=f"{kind}={new}: {entry['message']}",
            )

    async def _record(self, snap: EntitySnapshot, *, type: str, reason: str, message: str) -> None:
        """Record an Event. Started in the background (the loop waits for all of them
        before it sleeps), so a wake's scale-up does not wait for its own Event;
        histories from before that change record them inline."""
        event = self._event(snap, type=type, reason=reason, message=message)
        if workflow.patched(WAKE_CRITICAL_PATH):
            self._events_sent.append(call_kube(KubeActivities.record_event, event))
        else:
            await call_kube(KubeActivities.record_event, event)

    async def _events_recorded(self) -> None:
        sent, self._events_sent = self._events_sent, []
        for event in sent:
            await event


def _next_pass(result: RolloutResult | None, *, refused: bool) -> tuple[timedelta | None, str]:
    """When to look again after a rollout, and what the workflow is doing meanwhile: a
    rollout the API server refused waits for a spec change or `retry`, one that gave
    up (pods died, the deadline passed) is tried again after a back-off."""
    if refused:
        return (
            None,
            "stopped (the API server refused the rollout): waiting for a spec change or `retry`",
        )
    if result is None or result.converged:
        return RESYNC, "steady"
    return RETRY_FAILED_ROLLOUT, "waiting to retry the rollout"


def _only_ready_differs(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether `after` differs from `before` by its Ready condition alone, which happens
    only to a status carried over (continue-as-new) from code that did not write Ready."""

    def apart_from_ready(status: dict[str, Any]) -> dict[str, Any]:
        others = [c for c in status.get("conditions", []) if c.get("type") != C.READY]
        return {**status, "conditions": others}

    return before != after and apart_from_ready(before) == apart_from_ready(after)
