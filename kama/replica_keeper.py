"""How many replicas a ModelDeployment should have, in one place: the replica keeper.

Every rule of the README's Autoscaling section is a case of `ReplicaKeeper.decide`:
a request waiting at zero wakes the model (to `max(1, minReplicas)`); demand scales
it between `minReplicas` and `maxReplicas` (`kama.autoscaling`); after `idleTimeout`
without a request it goes back to `minReplicas` (to zero when that is 0), but only
once the replicas themselves say no slot is busy; a `kubectl scale` by anyone is
respected (it restarts the idle clock and the scale-down window); while KEDA owns
`spec.replicas` the keeper stands back and only keeps the demand it is asked about.

The keeper holds what it must remember (`ReplicaMemory`: the idle clock, the demand
ledger, the scales on their way back through the watch) and decides from facts the
workflow gathered (`ReplicaFacts`); it does no I/O and reads no clock. The workflow
acts on its `ReplicaDecision` (writes `spec.replicas` through `/scale`, asks the
replicas about busy slots) and converges the pods to `desired`.

The idle clock — when the model was last wanted — lives only here: a demand report,
a wake, a scale-up by anyone, a replica becoming routable and a busy slot restart it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from kama.api.deployment import ModelDeploymentSpec
from kama.autoscaling import ScalingRule
from kama.demand_ledger import DemandLedger, scaling_rule, stale_after
from kama.durations import parse_duration

DECISION_WAIT_FLOOR: Final = timedelta(milliseconds=50)
"""The shortest wait before the next demand decision (a window closing now)."""
REPORTED_DEMAND_RECHECK_FLOOR: Final = timedelta(seconds=1)
"""The shortest wait before looking again at a model held up by reported demand."""


@dataclass(frozen=True)
class ReplicaBounds:
    """What the spec says about the replica count, parsed."""

    min_replicas: int
    max_replicas: int
    idle_timeout: timedelta
    idle_timeout_text: str  # as the user wrote it, for messages
    stale_after: timedelta  # a gateway silent this long no longer counts
    rule: ScalingRule


@dataclass(frozen=True)
class ReplicaFacts:
    """What the workflow gathered for one decision."""

    generation: int  # of the spec read
    replicas: int  # spec.replicas as read
    bounds: ReplicaBounds
    now: datetime
    wake: bool = False  # a request is held for the model at zero
    keda: bool = False  # KEDA owns spec.replicas now (`workflows.keda_handoff`)


@dataclass(frozen=True)
class ReplicaDecision:
    """What to do about the replica count now."""

    desired: int  # the replicas to converge to
    scale_to: int | None = None  # write spec.replicas (through /scale) to this first
    why: str = ""  # the reason of that write, for its Event
    woke: bool = False  # the scale is a wake: note `status.lastWake`
    ask_replicas: bool = False  # idle: scale to `idle_floor` unless a replica is busy
    look_again: timedelta | None = None  # when the replica count may change by itself


@dataclass
class ReplicaMemory:
    """What the keeper remembers between passes and across continue-as-new (plain
    JSON: times are ISO strings)."""

    wanted_at: str | None = None  # the idle clock: when the model was last wanted
    seen_replicas: int = 0  # spec.replicas at the last decision
    seen_routable: int = 0  # replicas accepting requests at the last look
    woke_at_generation: int | None = None  # our wake's scale, not yet back in the spec
    autoscaled_at_generation: int | None = None  # our demand scale, not yet back
    demand: DemandLedger = field(default_factory=DemandLedger)


def desired_replicas(*, replicas: int, bounds: ReplicaBounds) -> int:
    """spec.replicas within [minReplicas, maxReplicas]: what the pods converge to."""
    return max(bounds.min_replicas, min(replicas, bounds.max_replicas))


def rollout_outdated(
    *, rolling: Mapping[str, Any], newest: Mapping[str, Any], desired: int
) -> bool:
    """Whether the spec `newest` asks for something else than a rollout of `rolling`
    to `desired` replicas (a replica count that comes to the same, as after a wake,
    is not a change)."""
    if {k: v for k, v in newest.items() if k != "replicas"} != {
        k: v for k, v in rolling.items() if k != "replicas"
    }:
        return True
    spec = ModelDeploymentSpec.model_validate(newest)
    return desired_replicas(replicas=spec.replicas, bounds=replica_bounds(spec)) != desired


class ReplicaKeeper:
    """Decides the replica count from the facts and its memory (which it updates)."""

    def __init__(self, memory: ReplicaMemory) -> None:
        self.memory = memory

    # what happened -----------------------------------------------------------

    def wanted(self, *, now: datetime) -> None:
        """Someone wants the model now: the idle clock restarts."""
        self.memory.wanted_at = now.isoformat()

    def reported(
        self,
        *,
        gateway: str,
        demand: int,
        busy_pods: list[str],
        risen_for: timedelta,
        now: datetime,
    ) -> bool:
        """A gateway's demand report (it wants the model); whether the total changed."""
        self.wanted(now=now)
        return self.memory.demand.record(
            gateway=gateway, demand=demand, busy_pods=busy_pods, now=now, risen_for=risen_for
        )

    def routable(self, *, count: int, now: datetime) -> None:
        """`count` replicas accept requests now: one more than before restarts the idle
        clock (a replica that loaded for most of idleTimeout is not scaled away the
        moment it is ready)."""
        if count > self.memory.seen_routable:
            self.wanted(now=now)
        self.memory.seen_routable = count

    def busy(self, *, now: datetime, bounds: ReplicaBounds) -> timedelta:
        """A replica asked when idle had a busy slot (or was too busy to answer): the
        model is wanted; how long until it may be idle again."""
        self.wanted(now=now)
        return bounds.idle_timeout

    # the decision ------------------------------------------------------------

    def decide(self, facts: ReplicaFacts) -> ReplicaDecision:
        """The replica count for `facts`, and when it may change by itself."""
        self._saw(facts)
        if facts.keda:
            return self._stand_back(facts)
        if facts.wake:
            woken = self._wake(facts)
            if woken is not None:
                return woken
        replicas, scale, due = self._autoscale(facts)
        idle = self._idle(facts, replicas=replicas) if scale is None else None
        look = _earliest(due, idle.look_again if idle is not None else None)
        desired = desired_replicas(replicas=replicas, bounds=facts.bounds)
        if scale is not None:
            return ReplicaDecision(
                desired=desired, scale_to=scale[0], why=scale[1], look_again=look
            )
        return ReplicaDecision(
            desired=desired,
            ask_replicas=idle is not None and idle.ask_replicas,
            look_again=look,
        )

    def idle_floor(self, bounds: ReplicaBounds) -> tuple[int, str]:
        """Where an idle model goes, and why (for the scale's Event)."""
        return bounds.min_replicas, f"no request for {bounds.idle_timeout_text} (idleTimeout)"

    # the cases ---------------------------------------------------------------

    def _saw(self, facts: ReplicaFacts) -> None:
        """A scale by anyone (`kubectl scale`, KEDA, ours coming back) restarts the
        scale-down window; a scale up also restarts the idle clock."""
        memory = self.memory
        if facts.replicas > memory.seen_replicas:
            self.wanted(now=facts.now)
        if facts.replicas != memory.seen_replicas:
            memory.demand.scaled(now=facts.now)
        memory.seen_replicas = facts.replicas

    def _stand_back(self, facts: ReplicaFacts) -> ReplicaDecision:
        """KEDA reads the demand from the `status` query: forget the reports of
        gateways gone silent; look again while some demand is still reported."""
        if facts.wake:  # the held request reaches KEDA through the gateway's scaler
            self.wanted(now=facts.now)
        ledger, fresh_for = self.memory.demand, facts.bounds.stale_after
        ledger.expire(stale_after=fresh_for, now=facts.now)
        return ReplicaDecision(
            desired=desired_replicas(replicas=facts.replicas, bounds=facts.bounds),
            look_again=fresh_for if ledger.total() > 0 else None,
        )

    def _wake(self, facts: ReplicaFacts) -> ReplicaDecision | None:
        """A request waits: at least max(1, minReplicas); None when there are already."""
        self.wanted(now=facts.now)
        wanted = max(1, facts.bounds.min_replicas)
        if facts.replicas >= wanted:
            return None
        desired = desired_replicas(replicas=wanted, bounds=facts.bounds)
        if self.memory.woke_at_generation == facts.generation:  # our write is on its way
            return ReplicaDecision(desired=desired)
        self.memory.woke_at_generation = facts.generation
        self.memory.seen_replicas = wanted
        return ReplicaDecision(
            desired=desired,
            scale_to=wanted,
            why="a request arrived while at zero",
            woke=True,
        )

    def _autoscale(
        self, facts: ReplicaFacts
    ) -> tuple[int, tuple[int, str] | None, timedelta | None]:
        """Demand scaling: the replicas after it, the scale to write (count, why) if
        any, and how long until demand may ask again."""
        now, ledger = facts.now, self.memory.demand
        ledger.expire(stale_after=facts.bounds.stale_after, now=now)
        if self.memory.autoscaled_at_generation == facts.generation:
            return facts.replicas, None, None  # our last scale is on its way back
        decision, due = ledger.decide(rule=facts.bounds.rule, current=facts.replicas, now=now)
        wait = None if due is None else max(due - now, DECISION_WAIT_FLOOR)
        if decision is None or decision.replicas == facts.replicas:
            return facts.replicas, None, wait
        self.memory.autoscaled_at_generation = facts.generation
        self.memory.seen_replicas = decision.replicas
        ledger.scaled(now=now)
        return decision.replicas, (decision.replicas, decision.reason), wait

    def _idle(self, facts: ReplicaFacts, *, replicas: int) -> ReplicaDecision | None:
        """Back to minReplicas after idleTimeout without demand. None when already at
        the minimum; otherwise when that is due, or `ask_replicas` when it is due now
        (busy slots count as demand: a long stream keeps the model up even if no
        gateway reported it)."""
        bounds, now = facts.bounds, facts.now
        if replicas <= bounds.min_replicas:
            return None
        if self.memory.wanted_at is None:
            self.wanted(now=now)
        assert self.memory.wanted_at is not None
        due = datetime.fromisoformat(self.memory.wanted_at) + bounds.idle_timeout - now
        desired = desired_replicas(replicas=replicas, bounds=bounds)
        if due > timedelta(0):
            return ReplicaDecision(desired=desired, look_again=due)
        # a report that is late but not stale still counts: with a short idleTimeout
        # a report period is half of it, and a gateway relaying a stream whose
        # generation has ended holds no slot a probe could see
        if self.memory.demand.total() > 0:
            recheck = min(bounds.stale_after, bounds.idle_timeout)
            return ReplicaDecision(
                desired=desired, look_again=max(recheck, REPORTED_DEMAND_RECHECK_FLOOR)
            )
        return ReplicaDecision(desired=desired, ask_replicas=True)


def _earliest(*waits: timedelta | None) -> timedelta | None:
    known = [w for w in waits if w is not None]
    return min(known) if known else None


def replica_bounds(spec: ModelDeploymentSpec) -> ReplicaBounds:
    """The replica bounds, timeouts and demand rule `spec` sets."""
    return ReplicaBounds(
        min_replicas=spec.scaling.min_replicas,
        max_replicas=spec.scaling.max_replicas,
        idle_timeout=parse_duration(spec.scaling.idle_timeout),
        idle_timeout_text=spec.scaling.idle_timeout,
        stale_after=stale_after(spec),
        rule=scaling_rule(spec),
    )
