"""What a gateway tells the workflows about demand: when a model's demand is worth a
signal (rises at once, falls and steady load once a period, nothing at rest), what a
report holds, and the in-flight counts a draining pod's drain workflow waits for."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import cast

import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gateway.demand import (
    MIN_GAP_S,
    RISE_COALESCE_S,
    SAMPLE_INTERVAL_S,
    ReportSchedule,
    current_demand,
    demand_report,
    report_demand,
)
from gateway.registry import Model, ModelRegistry
from kama.contracts import DEMAND, DemandReport
from tests.unit.gateway_support import ManualClock, deployment, pod

PERIOD = 30.0


def run(schedule: ReportSchedule, demands: list[int], *, every: float = 1.0) -> list[int]:
    """Sample `demands` one per `every` seconds; the demands reported."""
    sent = []
    for tick, demand in enumerate(demands, start=1):
        found = schedule.sample(demand, now=tick * every, period_s=PERIOD)
        if found is not None:
            sent.append(found)
    return sent


def test_nothing_is_reported_at_rest() -> None:
    assert run(ReportSchedule(), [0] * 600) == []


def test_a_steady_load_is_reported_once_a_period_not_every_sample() -> None:
    # 10 minutes of a load jittering between 7 and 8 requests
    sent = run(ReportSchedule(), [7 + tick % 2 for tick in range(600)])
    assert sent[:2] == [7, 8], "a rise is reported at once"
    assert set(sent[2:]) == {8}, "then the period's peak"
    assert len(sent) <= 600 / PERIOD + 2  # 2 s reports would be 300
    # in Temporal actions per hour: at most 120 with a 30 s period, before 1800


def test_a_rise_is_reported_within_the_minimum_gap_and_a_fall_within_a_period() -> None:
    schedule = ReportSchedule()
    assert run(schedule, [2]) == [2]
    assert schedule.sample(6, now=1.5, period_s=PERIOD) is None  # 2 s gap not over
    assert schedule.sample(6, now=3.0, period_s=PERIOD) == 6
    falls = [schedule.sample(0, now=3.0 + t, period_s=PERIOD) for t in range(1, 70)]
    reported = [d for d in falls if d is not None]
    assert reported == [6, 0], "the period's peak, then zero once, then silence"


def chat_registry() -> tuple[ModelRegistry, Model]:
    registry = ModelRegistry()
    registry.apply_deployment("ADDED", deployment("chat"))
    registry.apply_pod("ADDED", pod("p0", ip="10.0.0.1", slots=2))
    registry.apply_pod("ADDED", pod("p1", ip="10.0.0.2", slots=2))
    model = registry.resolve("ns/chat")
    assert model is not None
    return registry, model


def test_a_report_holds_in_flight_queued_and_per_pod_counts() -> None:
    registry, model = chat_registry()
    leases = [registry.acquire(model, route="chat", exclude=(), now=0.0) for _ in range(3)]
    model.held = 2  # e.g. waiting at zero
    report = demand_report(model, gateway="gw")
    assert (report.in_flight, report.queued, report.demand) == (3, 2, 5)
    assert sorted(report.pods.values()) == [1, 2]
    for lease in leases:
        assert lease is not None
        lease.release()
    model.held = 0
    # requests that came and went between two samples still count as demand
    assert current_demand(model) == 1
    assert current_demand(model) == 0


def test_the_report_period_follows_the_models_windows() -> None:
    registry = ModelRegistry()
    spec = deployment("quick")
    spec["spec"]["scaling"].update(idleTimeout="1m", scaleDownWindow="5m")
    registry.apply_deployment("ADDED", spec)
    model = registry.resolve("ns/quick")
    assert model is not None and model.report_period_s == 15.0


def test_a_draining_pod_with_requests_here_is_announced_then_its_last_request() -> None:
    registry, model = chat_registry()
    lease = registry.acquire(model, route="chat", exclude=(), now=0.0)
    assert lease is not None
    busy = lease.endpoint.pod
    idle = "p1" if busy == "p0" else "p0"
    for name in (busy, idle):
        registry.apply_pod("MODIFIED", pod(name, draining=True))
    assert list(registry.drain_notices) == [("ns", busy, 1)], "only the pod with requests"
    assert registry.drain_noticed.is_set()
    registry.drain_notices.clear()
    lease.release()
    assert list(registry.drain_notices) == [("ns", busy, 0)]


class SignalRecorder:
    """Stands in for the Temporal client: when (on the test's clock) each signal was
    sent, to which workflow, under which name, and what."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.sent: list[tuple[float, str, str, DemandReport]] = []
        self.failures: list[float] = []  # when each signal that failed was tried
        self.fail_next = 0  # signals to fail (Temporal unavailable) before the next is sent

    def get_workflow_handle(self, workflow_id: str) -> SignalRecorder.Handle:
        return SignalRecorder.Handle(self, workflow_id)

    class Handle:
        def __init__(self, recorder: SignalRecorder, workflow_id: str) -> None:
            self.recorder, self.workflow_id = recorder, workflow_id

        async def signal(self, signal: str, report: DemandReport, **_options: object) -> None:
            if self.recorder.fail_next > 0:
                self.recorder.fail_next -= 1
                self.recorder.failures.append(self.recorder.clock.now())
                raise RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b"")
            sent = (self.recorder.clock.now(), self.workflow_id, signal, report)
            self.recorder.sent.append(sent)


@contextlib.asynccontextmanager
async def reporting(registry: ModelRegistry) -> AsyncIterator[tuple[SignalRecorder, ManualClock]]:
    """The demand reporter of `registry`'s gateway running on a manual clock."""
    clock = ManualClock()
    recorder = SignalRecorder(clock)
    reporter = asyncio.create_task(
        report_demand(
            registry=registry,
            client=cast(Client, recorder),
            cluster="",
            gateway="gw",
            clock=clock,
        )
    )
    try:
        yield recorder, clock
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter


async def test_a_request_arriving_is_reported_at_once_not_at_the_next_interval() -> None:
    """The workflow's scale-up window starts with the report: sampling only once a
    second would add up to a second to every scale-out."""
    registry, model = chat_registry()
    async with reporting(registry) as (recorder, clock):
        await clock.advance(0.1)  # the reporter is waiting for its next sample
        arrived = clock.now()
        lease = registry.acquire(model, route="chat", exclude=(), now=0.0)
        assert lease is not None
        await clock.advance_until(lambda: bool(recorder.sent), within=SAMPLE_INTERVAL_S)
        [(sent_at, workflow_id, signal, report)] = recorder.sent
        # the burst's coalescing, not the sample interval
        assert sent_at - arrived == pytest.approx(RISE_COALESCE_S)
        assert workflow_id.startswith("deployment/ns/chat/") and signal == DEMAND
        assert (report.gateway, report.in_flight, report.queued) == ("gw", 1, 0)
        # the workflow dates the rise from the arrival, not from the coalesced report
        assert report.risen_for_s == pytest.approx(RISE_COALESCE_S)
        lease.release()


async def test_a_request_just_before_a_sample_is_coalesced_all_the_same() -> None:
    """A burst that begins just before the reporter's next sample is coalesced for the
    whole RISE_COALESCE_S too: cut short, its report named too few of its requests or
    reached the workflow before a short scaleUpWindow had passed, and the workflow's
    next look (a Temporal timer, which fires a second later at the soonest) held a
    scale-out back by a second (bench_scale_out, 2026-12-05)."""
    registry, model = chat_registry()
    async with reporting(registry) as (recorder, clock):
        await clock.advance(SAMPLE_INTERVAL_S - 0.05)  # the next sample is 50 ms away
        arrived = clock.now()
        first = registry.acquire(model, route="chat", exclude=(), now=0.0)
        await clock.advance(0.1)  # the burst's second request, after that sample was due
        second = registry.acquire(model, route="chat", exclude=(), now=0.0)
        await clock.advance_until(lambda: bool(recorder.sent), within=SAMPLE_INTERVAL_S)
        [(sent_at, _, _, report)] = recorder.sent
        assert sent_at - arrived == pytest.approx(RISE_COALESCE_S)
        assert report.risen_for_s == pytest.approx(RISE_COALESCE_S)
        assert report.in_flight == 2, "both of the burst's requests"
        for lease in (first, second):
            assert lease is not None
            lease.release()


async def test_a_rise_whose_report_failed_is_reported_again_after_the_gap() -> None:
    """A rise's report that does not reach the workflow (Temporal unavailable, an RPC
    timeout) is sent again once MIN_GAP_S has passed, not a report period later: the
    schedule had counted it as told, and a scale-out waited for the period's report
    of the peak (up to a minute)."""
    registry, model = chat_registry()
    assert model.report_period_s > MIN_GAP_S + RISE_COALESCE_S + SAMPLE_INTERVAL_S
    async with reporting(registry) as (recorder, clock):
        recorder.fail_next = 1
        await clock.advance(0.1)
        lease = registry.acquire(model, route="chat", exclude=(), now=0.0)
        await clock.advance_until(lambda: bool(recorder.sent), within=model.report_period_s)
        [failed] = recorder.failures
        [(sent_at, _, _, report)] = recorder.sent
        assert sent_at - failed == pytest.approx(MIN_GAP_S)
        assert report.demand == 1
        assert lease is not None
        lease.release()


def test_a_rise_held_back_by_the_gap_is_due_when_the_gap_ends() -> None:
    schedule = ReportSchedule()
    assert schedule.sample(1, now=10.0, period_s=PERIOD) == 1
    assert schedule.sample(3, now=10.4, period_s=PERIOD) is None
    assert schedule.rise_due == 12.0, "the reporter wakes exactly then, not at a later tick"
    assert schedule.sample(3, now=12.0, period_s=PERIOD) == 3
    assert schedule.rise_due is None


async def test_a_held_rise_goes_out_as_the_gap_ends() -> None:
    registry, model = chat_registry()
    async with reporting(registry) as (recorder, clock):
        first = registry.acquire(model, route="chat", exclude=(), now=0.0)
        await clock.advance_until(lambda: bool(recorder.sent), within=SAMPLE_INTERVAL_S)
        await clock.advance(0.5)
        second = registry.acquire(model, route="chat", exclude=(), now=0.0)
        await clock.advance_until(lambda: len(recorder.sent) >= 2, within=MIN_GAP_S)
        (one, _, _, report_one), (two, _, _, report_two) = recorder.sent
        assert (report_one.demand, report_two.demand) == (1, 2)
        assert two - one == pytest.approx(MIN_GAP_S), "not at a later sample"
        for lease in (first, second):
            assert lease is not None
            lease.release()
