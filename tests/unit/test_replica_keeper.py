"""The replica keeper, rule by rule: every rule of the README's Autoscaling section is
a row here (what happened, in order, and what the keeper decides at the end), so a
change of rule shows up as a changed row, not as a stack test timing out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from kama.api.deployment import ModelDeploymentSpec
from kama.replica_keeper import (
    DECISION_WAIT_FLOOR,
    ReplicaDecision,
    ReplicaFacts,
    ReplicaKeeper,
    ReplicaMemory,
    desired_replicas,
    replica_bounds,
    rollout_outdated,
)

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def spec(**scaling: object) -> ModelDeploymentSpec:
    """A deployment of 2 slots per replica; scaling defaults as the README's, with
    a 10-minute idleTimeout."""
    return ModelDeploymentSpec.model_validate(
        {
            "modelRef": {"name": "m"},
            "runtime": {"concurrency": 2, "contextSize": 4096},
            "scaling": {"idleTimeout": "10m", **scaling},
        }
    )


@dataclass
class Story:
    """What happens to a deployment, then the decision the keeper makes at the end."""

    spec: ModelDeploymentSpec = field(default_factory=spec)
    keeper: ReplicaKeeper = field(default_factory=lambda: ReplicaKeeper(ReplicaMemory()))
    generation: int = 1
    replicas: int = 1  # spec.replicas as the keeper last saw it

    def decide(
        self, at: float, *, replicas: int | None = None, wake: bool = False, keda: bool = False
    ) -> ReplicaDecision:
        """A pass at T0 + `at` seconds; spec.replicas is `replicas` if given (a scale by
        anyone, a new generation), else what the keeper last decided."""
        if replicas is not None and replicas != self.replicas:
            self.replicas, self.generation = replicas, self.generation + 1
        decision = self.keeper.decide(
            ReplicaFacts(
                generation=self.generation,
                replicas=self.replicas,
                bounds=replica_bounds(self.spec),
                now=T0 + timedelta(seconds=at),
                wake=wake,
                keda=keda,
            )
        )
        return decision

    def echo(self, decision: ReplicaDecision) -> None:
        """Our scale comes back through the watch: a new generation."""
        if decision.scale_to is not None:
            self.replicas, self.generation = decision.scale_to, self.generation + 1

    def report(self, at: float, demand: int, *, gateway: str = "g", busy: int = 0) -> None:
        self.keeper.reported(
            gateway=gateway,
            demand=demand,
            busy_pods=[f"pod-{i}" for i in range(busy)],
            risen_for=timedelta(0),
            now=T0 + timedelta(seconds=at),
        )


Check = Callable[[Story], None]


def wake_at_zero(s: Story) -> None:
    s.spec = spec(minReplicas=0)
    d = s.decide(0, replicas=0, wake=True)
    assert (d.scale_to, d.desired, d.woke) == (1, 1, True)


def wake_to_min_replicas(s: Story) -> None:
    s.spec = spec(minReplicas=2, maxReplicas=4)
    d = s.decide(0, replicas=0, wake=True)
    assert (d.scale_to, d.desired) == (2, 2)


def wake_written_once(s: Story) -> None:
    s.spec = spec(minReplicas=0)
    first = s.decide(0, replicas=0, wake=True)
    again = s.decide(1, wake=True)  # our write is not back yet: same generation
    assert first.scale_to == 1 and again.scale_to is None and again.desired == 1


def wake_with_replicas_is_nothing(s: Story) -> None:
    d = s.decide(0, replicas=1, wake=True)
    assert d.scale_to is None and d.desired == 1 and not d.woke


def no_scale_up_from_zero_without_a_wake(s: Story) -> None:
    s.spec = spec(minReplicas=0)
    s.decide(0, replicas=0)
    s.report(1, 20)
    d = s.decide(60)
    assert d.scale_to is None and d.desired == 0


def up_after_a_sustained_window(s: Story) -> None:
    s.spec = spec(maxReplicas=8)
    s.decide(0, replicas=1)
    s.report(0, 6)  # 6 requests want ceil(6 / (2 * 0.8)) = 4 replicas
    early = s.decide(29)
    assert early.scale_to is None and early.look_again == timedelta(seconds=1)
    d = s.decide(30)
    assert d.scale_to == 4 and "6 requests" in d.why


def a_spike_does_not_scale(s: Story) -> None:
    s.spec = spec(maxReplicas=8)
    s.decide(0, replicas=1)
    s.report(0, 1)
    s.report(10, 9)
    s.report(12, 1)
    assert s.decide(40).scale_to is None


def up_capped_at_max(s: Story) -> None:
    s.spec = spec(maxReplicas=3)
    s.decide(0, replicas=1)
    s.report(0, 50)
    assert s.decide(30).scale_to == 3


def down_one_at_a_time_after_the_window(s: Story) -> None:
    s.spec = spec(maxReplicas=8, scaleDownWindow="5m")
    s.decide(0, replicas=4)
    s.report(0, 1)
    assert s.decide(299).scale_to is None, "the scale to 4 is within the window"
    d = s.decide(300)
    assert d.scale_to == 3
    s.echo(d)
    assert s.decide(301).scale_to is None, "our own scale restarts the window"
    assert s.decide(601).scale_to == 2


def never_below_busy_replicas(s: Story) -> None:
    s.spec = spec(maxReplicas=8)
    s.decide(0, replicas=3)
    for at in range(0, 600, 60):  # one request over three replicas, each with a stream
        s.report(at, 1, busy=3)
    assert s.decide(600).scale_to is None


def never_below_one_while_demand(s: Story) -> None:
    s.spec = spec(minReplicas=0, maxReplicas=8)
    s.decide(0, replicas=1)
    s.report(0, 1)
    assert s.decide(900).scale_to is None


def never_below_min_replicas(s: Story) -> None:
    s.spec = spec(minReplicas=2, maxReplicas=8)
    s.decide(0, replicas=2)
    s.report(0, 0)
    d = s.decide(9000)
    assert d.scale_to is None and not d.ask_replicas and d.desired == 2


def kubectl_scale_kept_for_the_window(s: Story) -> None:
    s.spec = spec(maxReplicas=8, scaleDownWindow="5m")
    s.decide(0, replicas=1)
    s.report(0, 2)
    s.decide(100, replicas=5)  # kubectl scale: above what 2 requests want
    assert s.decide(399).scale_to is None
    assert s.decide(400).scale_to == 4, "undone one replica per window"


def kubectl_scale_kept_while_demand_asks(s: Story) -> None:
    s.spec = spec(maxReplicas=8, scaleDownWindow="5m")
    s.decide(0, replicas=1)
    s.report(0, 6)  # wants 4
    s.decide(10, replicas=4)
    assert s.decide(900).scale_to is None


def idle_to_zero_asks_the_replicas(s: Story) -> None:
    s.spec = spec(minReplicas=0)
    s.decide(0, replicas=1)
    waiting = s.decide(300)
    assert waiting.look_again == timedelta(minutes=5) and not waiting.ask_replicas
    d = s.decide(600)
    assert d.ask_replicas and d.scale_to is None
    assert s.keeper.idle_floor(replica_bounds(s.spec))[0] == 0


def idle_to_min_replicas(s: Story) -> None:
    s.spec = spec(minReplicas=1, maxReplicas=3, scaleDownWindow="1h")
    s.decide(0, replicas=3)
    assert not s.decide(599).ask_replicas
    d = s.decide(600)
    assert d.ask_replicas and d.scale_to is None, "idleTimeout before scaleDownWindow"
    assert s.keeper.idle_floor(replica_bounds(s.spec))[0] == 1


def a_busy_replica_restarts_the_idle_clock(s: Story) -> None:
    s.spec = spec(minReplicas=0)
    s.decide(0, replicas=1)
    assert s.decide(600).ask_replicas
    assert s.keeper.busy(now=T0 + timedelta(seconds=600), bounds=replica_bounds(s.spec)) == (
        timedelta(minutes=10)
    )
    assert not s.decide(1199).ask_replicas
    assert s.decide(1200).ask_replicas


def a_late_report_holds_the_model_up(s: Story) -> None:
    s.spec = spec(minReplicas=0, idleTimeout="10s", scaleDownWindow="5m")
    s.decide(0, replicas=1)
    s.report(0, 1)  # stale after 3 report periods of 5 s
    d = s.decide(12)
    assert not d.ask_replicas and d.look_again == timedelta(seconds=10)
    assert s.decide(16).ask_replicas, "gone silent: stale, it no longer counts"


def a_report_restarts_the_idle_clock(s: Story) -> None:
    s.spec = spec(minReplicas=0)
    s.decide(0, replicas=1)
    s.report(500, 0)
    assert not s.decide(600).ask_replicas
    assert s.decide(1100).ask_replicas


def a_scale_up_by_anyone_restarts_the_idle_clock(s: Story) -> None:
    s.spec = spec(minReplicas=0, maxReplicas=3)
    s.decide(0, replicas=0)
    s.decide(500, replicas=1)  # kubectl scale
    assert not s.decide(600).ask_replicas
    assert s.decide(1100).ask_replicas


def a_replica_becoming_routable_restarts_the_idle_clock(s: Story) -> None:
    s.spec = spec(minReplicas=0)
    s.decide(0, replicas=1)
    s.keeper.routable(count=1, now=T0 + timedelta(seconds=550))
    assert not s.decide(600).ask_replicas
    s.keeper.routable(count=1, now=T0 + timedelta(seconds=700))  # no new one: no restart
    assert s.decide(1150).ask_replicas


def keda_stands_back(s: Story) -> None:
    s.spec = spec(minReplicas=0, maxReplicas=8)
    s.decide(0, replicas=0, keda=True)
    s.report(0, 50)
    woken = s.decide(1, wake=True, keda=True)
    assert woken.scale_to is None and woken.desired == 0 and woken.look_again is not None
    d = s.decide(9000, replicas=2, keda=True)
    assert d.scale_to is None and not d.ask_replicas and d.desired == 2
    assert d.look_again is None, "the silent gateway's demand is forgotten"


def desired_within_bounds(s: Story) -> None:
    s.spec = spec(minReplicas=1, maxReplicas=2)
    assert s.decide(0, replicas=0).desired == 1, "kubectl get md shows 1, not 0"
    assert s.decide(1, replicas=5).desired == 2


def our_scale_on_its_way_is_not_decided_again(s: Story) -> None:
    s.spec = spec(maxReplicas=8)
    s.decide(0, replicas=1)
    s.report(0, 6)
    assert s.decide(30).scale_to == 4
    assert s.decide(31).scale_to is None, "the same generation: still on its way"


def next_decision_when_the_window_closes(s: Story) -> None:
    s.spec = spec(maxReplicas=8)
    s.decide(0, replicas=1)
    s.report(10, 6)
    assert s.decide(25).look_again == timedelta(seconds=5), "the window from 0 closes"
    d = s.decide(30)
    assert d.scale_to is None and d.look_again == timedelta(seconds=10)
    scaled = s.decide(40)
    assert scaled.scale_to == 4, "the window of the rise closes: it scales"
    assert scaled.look_again is not None and scaled.look_again >= DECISION_WAIT_FLOOR


RULES: dict[str, Check] = {
    "a request at zero wakes the model": wake_at_zero,
    "a wake brings minReplicas": wake_to_min_replicas,
    "a wake is written once while it comes back": wake_written_once,
    "a wake with replicas changes nothing": wake_with_replicas_is_nothing,
    "from zero only by a request": no_scale_up_from_zero_without_a_wake,
    "up when the whole scaleUpWindow wants more": up_after_a_sustained_window,
    "a spike shorter than the window does not scale": a_spike_does_not_scale,
    "up capped at maxReplicas": up_capped_at_max,
    "down one replica per scaleDownWindow": down_one_at_a_time_after_the_window,
    "never below replicas with a request in flight": never_below_busy_replicas,
    "never below one while there is demand": never_below_one_while_demand,
    "never below minReplicas": never_below_min_replicas,
    "kubectl scale is kept for scaleDownWindow": kubectl_scale_kept_for_the_window,
    "kubectl scale is kept while demand asks for it": kubectl_scale_kept_while_demand_asks,
    "to zero after idleTimeout, once the replicas say idle": idle_to_zero_asks_the_replicas,
    "idle goes to minReplicas": idle_to_min_replicas,
    "a busy slot restarts the idle clock": a_busy_replica_restarts_the_idle_clock,
    "a late but fresh report holds the model up": a_late_report_holds_the_model_up,
    "a demand report restarts the idle clock": a_report_restarts_the_idle_clock,
    "a scale up by anyone restarts the idle clock": a_scale_up_by_anyone_restarts_the_idle_clock,
    "a replica turning routable restarts the idle clock": (
        a_replica_becoming_routable_restarts_the_idle_clock
    ),
    "KEDA mode: no wake, no scaling, no idling": keda_stands_back,
    "DESIRED is spec.replicas within the bounds": desired_within_bounds,
    "our scale on its way back is not decided again": our_scale_on_its_way_is_not_decided_again,
    "the next decision is due when its window closes": next_decision_when_the_window_closes,
}


@pytest.mark.parametrize("check", RULES.values(), ids=RULES.keys())
def test_rule(check: Check) -> None:
    check(Story())


def test_desired_replicas_clamps() -> None:
    bounds = replica_bounds(spec(minReplicas=1, maxReplicas=3))
    assert [desired_replicas(replicas=n, bounds=bounds) for n in range(5)] == [1, 1, 2, 3, 3]


FOUR = {"maxReplicas": 4}


@pytest.mark.parametrize(
    ("newest", "desired", "outdated"),
    [
        ({"modelRef": {"name": "m"}, "replicas": 2, "scaling": FOUR}, 2, False),
        ({"modelRef": {"name": "m"}, "replicas": 3, "scaling": FOUR}, 2, True),
        ({"modelRef": {"name": "other"}, "replicas": 2, "scaling": FOUR}, 2, True),
        ({"modelRef": {"name": "m"}, "replicas": 9, "scaling": FOUR}, 4, False),
    ],
)
def test_a_rollout_is_outdated_only_by_another_ask(
    newest: dict[str, object], desired: int, outdated: bool
) -> None:
    rolling = {"modelRef": {"name": "m"}, "replicas": 1, "scaling": FOUR}
    assert rollout_outdated(rolling=rolling, newest=newest, desired=desired) is outdated
