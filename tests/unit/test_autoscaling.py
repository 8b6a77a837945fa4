"""The built-in autoscaling rule (kama.autoscaling): what replica count a demand
history asks for, as a user watching `kubectl get md` would see it change."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta

from kama.autoscaling import (
    MAX_RISE_AGE,
    DemandPoint,
    ScalingRule,
    decide_scale,
    next_decision_due,
    prune_history,
    replicas_for,
    report_period,
    total_demand,
)
from kama.demand_ledger import DemandLedger

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RULE = ScalingRule(
    min_replicas=0,
    max_replicas=3,
    slots=4,
    target_percent=80,
    scale_up_window=timedelta(seconds=30),
    scale_down_window=timedelta(minutes=5),
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def decide(
    history: Sequence[tuple[float, int]],
    *,
    now: float,
    current: int,
    busy: int = 0,
    last_scaled: float | None = None,
    rule: ScalingRule = RULE,
) -> int | None:
    found = decide_scale(
        rule=rule,
        history=[DemandPoint(at(t), d) for t, d in history],
        current=current,
        busy_replicas=busy,
        last_scaled=None if last_scaled is None else at(last_scaled),
        now=at(now),
    )
    return None if found is None else found.replicas


def test_replicas_for_demand_at_the_target_utilisation() -> None:
    assert replicas_for(0, slots=4, target_percent=80) == 0
    assert replicas_for(3, slots=4, target_percent=80) == 1  # 3/4 = 75% ≤ 80%
    assert replicas_for(4, slots=4, target_percent=80) == 2  # 100% of one replica
    assert replicas_for(12, slots=4, target_percent=100) == 3


def test_sustained_load_scales_up_in_one_step_to_what_it_needs_within_max() -> None:
    assert decide([(0, 10)], now=29, current=1) is None  # not a whole window yet
    assert decide([(0, 10)], now=30, current=1) == 3  # 10 / 3.2 per replica -> 4, max 3
    assert decide([(0, 6)], now=31, current=1) == 2


def test_a_spike_shorter_than_the_window_does_not_scale_up() -> None:
    history = [(0, 1), (20, 12), (25, 1)]
    assert decide(history, now=40, current=1) is None
    # the lowest level of the window decides: 12 for 30 s, then back to 6
    assert decide([(0, 12), (40, 6)], now=50, current=1) == 2


def test_scale_down_one_at_a_time_after_the_stabilisation_window() -> None:
    history = [(0, 12), (100, 0)]
    assert decide(history, now=399, current=3) is None  # 12 still inside the window
    assert decide(history, now=400, current=3) == 2
    # the next step waits a whole window after that scale
    assert decide(history, now=500, current=2, last_scaled=400) is None
    assert decide(history, now=700, current=2, last_scaled=400) == 1
    # never to zero: that is idleTimeout's job
    assert decide(history, now=1100, current=1, last_scaled=700) is None


def test_never_below_min_replicas_nor_below_busy_replicas() -> None:
    quiet = [(0, 0)]
    rule = ScalingRule(**{**RULE.__dict__, "min_replicas": 2})
    assert decide(quiet, now=600, current=2, rule=rule) is None
    assert decide([(0, 2)], now=600, current=3, busy=3) is None  # all 3 still busy
    assert decide([(0, 2)], now=600, current=3, busy=1) == 2


def test_a_manual_scale_holds_for_the_window_then_demand_decides() -> None:
    quiet = [(0, 1)]
    assert decide(quiet, now=600, current=3, last_scaled=500) is None
    assert decide(quiet, now=800, current=3, last_scaled=500) == 2
    # demand that asks for at least as many keeps it
    assert decide([(0, 8)], now=800, current=3, last_scaled=500) is None


def test_at_zero_only_a_wake_scales() -> None:
    assert decide([(0, 20)], now=60, current=0) is None


def test_report_period_is_a_quarter_of_the_shortest_window_within_bounds() -> None:
    assert report_period(
        idle_timeout=timedelta(minutes=10), scale_down_window=timedelta(minutes=5)
    ) == timedelta(seconds=60)
    assert report_period(
        idle_timeout=timedelta(minutes=1), scale_down_window=timedelta(minutes=5)
    ) == timedelta(seconds=15)
    assert report_period(
        idle_timeout=timedelta(seconds=20), scale_down_window=timedelta(minutes=5)
    ) == timedelta(seconds=5)


def test_a_busy_model_is_reported_well_inside_its_idle_timeout() -> None:
    # a stream longer than a short idleTimeout must be reported before the model idles
    # down around it (the floor of the period must not outgrow idleTimeout)
    assert report_period(
        idle_timeout=timedelta(seconds=4), scale_down_window=timedelta(minutes=5)
    ) == timedelta(seconds=2)


def test_stale_gateways_no_longer_count() -> None:
    reports = {"gw-a": (at(0), 5), "gw-b": (at(50), 3)}
    assert total_demand(reports, stale_after=timedelta(seconds=60), now=at(55)) == 8
    assert total_demand(reports, stale_after=timedelta(seconds=60), now=at(61)) == 3


def test_pruning_keeps_the_level_a_window_starts_with() -> None:
    history = [DemandPoint(at(t), d) for t, d in [(0, 1), (100, 5), (400, 2)]]
    kept = prune_history(history, keep=timedelta(minutes=5), now=at(450))
    assert [p.demand for p in kept] == [5, 2]
    # 5 (2 replicas) is the window's peak, not 2 (1 replica)
    assert decide([(100, 5), (400, 2)], now=450, current=2) is None


def test_the_next_decision_is_due_when_a_window_closes() -> None:
    history = [DemandPoint(at(0), 10)]
    due = next_decision_due(rule=RULE, history=history, last_scaled=None, now=at(5))
    assert due == at(30)
    due = next_decision_due(rule=RULE, history=history, last_scaled=at(30), now=at(31))
    assert due == at(300)
    assert next_decision_due(rule=RULE, history=[], last_scaled=None, now=at(0)) is None


def test_a_rise_is_dated_from_the_arrival_its_gateway_saw() -> None:
    """The scale-up window starts when the load arrived, not when its (coalesced,
    signalled) report reached the workflow; by at most MAX_RISE_AGE, and never before
    the last change already recorded."""
    rule = replace(RULE, scale_up_window=timedelta(seconds=1))
    ledger = DemandLedger()
    ledger.record(gateway="gw", demand=1, busy_pods=[], now=at(0))
    ledger.record(
        gateway="gw", demand=8, busy_pods=[], now=at(10.3), risen_for=timedelta(seconds=0.3)
    )
    assert [s.at for s in ledger.history] == [at(0).isoformat(), at(10).isoformat()]
    decision, due = ledger.decide(rule=rule, current=1, now=at(10.3))
    assert decision is None and due == at(11), "the window closes 1 s after the arrival"
    decision, _ = ledger.decide(rule=rule, current=1, now=at(11))
    assert decision is not None and decision.replicas == 3

    ledger.record(gateway="gw", demand=12, busy_pods=[], now=at(20), risen_for=timedelta(hours=1))
    assert ledger.history[-1].at == (at(20) - MAX_RISE_AGE).isoformat(), "bounded"
    ledger.record(gateway="other", demand=1, busy_pods=[], now=at(20.1))
    ledger.record(
        gateway="gw", demand=13, busy_pods=[], now=at(20.2), risen_for=timedelta(seconds=0.5)
    )
    assert ledger.history[-1].at == at(20.1).isoformat(), "never before the last change"


def test_a_days_demand_changing_every_second_keeps_the_ledger_small_and_decisions_exact() -> None:
    """scaleDownWindow of a day, the total changing every second (#26 item 4): the
    ledger the workflow carries across continue-as-new stays a few KiB, far below
    Temporal's payload limit, and every decision is the one the whole history gives."""
    rule = replace(RULE, max_replicas=40, scale_down_window=timedelta(hours=24))
    ledger, full = DemandLedger(), []
    generator = random.Random(26)
    demand = 0
    for second in range(24 * 3600):
        demand = max(0, min(150, demand + generator.choice((-3, -1, 1, 2))))
        now = at(second)
        if ledger.record(gateway="g", demand=demand, busy_pods=[], now=now):
            full.append(DemandPoint(now, demand))
        if second % 3600 == 3599:
            for current in (1, 20):
                decision, due = ledger.decide(rule=rule, current=current, now=now)
                expected = decide_scale(
                    rule=rule, history=full, current=current, busy_replicas=0,
                    last_scaled=None, now=now,
                )  # fmt: skip
                assert decision == expected, (second, current)
                whole_due = next_decision_due(rule=rule, history=full, last_scaled=None, now=now)
                assert due is not None and whole_due is not None and due >= whole_due
    payload = json.dumps(asdict(ledger))
    assert len(full) > 40_000
    assert len(payload) < 16 * 1024, len(payload)
