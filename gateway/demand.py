"""Demand reaches each DeploymentWorkflow as its `demand` signal: this gateway's
requests in flight to the model plus those it queues (for a replica at zero or a free
slot), with the in-flight count per serving pod.

Reports are sent economically (`ReportSchedule`): a rise at once (sampled as soon as
a request arrives, at most one report per MIN_GAP_S), a fall or an unchanged non-zero demand once a period
(`kama.autoscaling.report_period`, derived from the model's idleTimeout and
scaleDownWindow, 5 s to 60 s), as the peak seen during that period, and nothing at
rest. A steady load therefore costs one Temporal action per model per period instead
of one every 2 s. Requests that came and went between two samples count as a demand
of one, so short requests keep a model from idling down.

Nothing here is state the workflow depends on: a gateway that stops reporting is
forgotten after a few periods (its demand ends), and the model idles down after its
idleTimeout (the workflow also checks busy slots itself before scaling to zero); a
request for a model at zero starts a wake."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, replace
from datetime import timedelta

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gateway import workflow_client
from gateway.clock import MONOTONIC, Clock, wait_for_event
from gateway.registry import Model, ModelRegistry
from kama.contracts import DemandReport

log = logging.getLogger("kama.gateway")

SAMPLE_INTERVAL_S = 1.0  # without arrivals: falls, steady load and stale peaks
RISE_COALESCE_S = 0.2  # arrivals this close together (a burst) are one sample
MIN_GAP_S = 2.0  # between two reports of one model
# a stalled Temporal must not stall the reports of every other model behind one call
REPORT_RPC_TIMEOUT = timedelta(seconds=2)


@dataclass
class ReportSchedule:
    """When one model's demand is worth a signal. `sample` takes the demand seen now
    and answers the demand to report, or None."""

    sent: int = 0  # the demand last reported
    sent_at: float = float("-inf")
    period_start: float = 0.0
    peak: int = 0  # the highest demand seen since period_start
    rise_due: float | None = None  # when a rise held back by MIN_GAP_S may go out

    def sample(self, demand: int, *, now: float, period_s: float) -> int | None:
        self.peak = max(self.peak, demand)
        self.rise_due = None
        if demand > self.sent:
            if now - self.sent_at >= MIN_GAP_S:
                return self._send(demand, now=now)
            self.rise_due = self.sent_at + MIN_GAP_S
        if now - self.period_start < period_s:
            return None
        peak, self.peak, self.period_start = self.peak, demand, now
        if peak > 0 or self.sent > 0:
            return self._send(peak, now=now)
        return None

    def _send(self, demand: int, *, now: float) -> int:
        self.sent, self.sent_at = demand, now
        return demand

    def undelivered(self, *, before: int) -> None:
        """The report just sent did not reach the workflow: if it was a rise, the
        demand `before` it stands as the last reported, so the rise goes out again
        after MIN_GAP_S (not a report period later, up to a minute)."""
        self.sent = min(self.sent, before)


def queued_now(model: Model) -> int:
    """Requests this gateway holds for a replica (at zero) or for a free slot."""
    return model.held + sum(1 for w in model.slot_waiters if not w.granted.done())


def local_demand(model: Model) -> int:
    """This gateway's requests in flight or queued now, without side effects."""
    return model.in_flight + queued_now(model)


def current_demand(model: Model) -> int:
    """Requests in flight or queued now; at least one if any came and went since the
    last sample."""
    demand = local_demand(model)
    if model.requests_since_report:
        model.requests_since_report = 0
        demand = max(demand, 1)
    return demand


def demand_report(model: Model, *, gateway: str) -> DemandReport:
    pods = {e.pod: e.in_flight for e in model.endpoints.values() if e.in_flight}
    return DemandReport(
        gateway=gateway, in_flight=model.in_flight, queued=queued_now(model), pods=pods
    )


def gateway_identity() -> str:
    """How this gateway names itself in reports: unique per process, stable while it
    runs (several gateways may share a host outside Kubernetes)."""
    return f"{socket.gethostname()}/{os.getpid()}"


async def report_demand(
    *,
    registry: ModelRegistry,
    client: Client,
    cluster: str,
    gateway: str,
    clock: Clock = MONOTONIC,
) -> None:
    schedules: dict[str, ReportSchedule] = {}
    while True:
        held = [s.rise_due for s in schedules.values() if s.rise_due is not None]
        within = min([SAMPLE_INTERVAL_S, *(due - clock.now() for due in held)])
        arrived = await next_sample(registry, within=max(within, 0.0), clock=clock)
        now = clock.now()
        for key in set(schedules) - set(registry.models):
            del schedules[key]
        for model in list(registry.models.values()):
            schedule = schedules.setdefault(model.key, ReportSchedule(period_start=now))
            reported = schedule.sent
            demand = schedule.sample(current_demand(model), now=now, period_s=model.report_period_s)
            if demand is None:
                continue
            report = demand_report(model, gateway=gateway)
            if report.demand < demand:  # the peak of the period, or a request now gone
                report = replace(report, in_flight=report.in_flight + demand - report.demand)
            if arrived is not None and demand > reported:  # a rise the arrival began
                report = replace(report, risen_for_s=round(clock.now() - arrived, 3))
            if not await _signal(client, model=model, cluster=cluster, report=report):
                schedule.undelivered(before=reported)


async def next_sample(registry: ModelRegistry, *, within: float, clock: Clock) -> float | None:
    """Wait until a request arrives (a rise is worth telling the workflow at once:
    its scale-up window starts at the arrival) or `within` seconds pass (the sample
    interval, or less when a rise held back by MIN_GAP_S may go out sooner); when the
    arrival that ended the wait came (on `clock`), None if none did. The arrivals of
    the next RISE_COALESCE_S join it, even past `within` (a sample due meanwhile
    would cut the burst short: its report would miss requests, and reach the workflow
    before a scaleUpWindow shorter than the coalescing has passed)."""
    arrived: float | None = None
    if await wait_for_event(registry.demand_rose, within=within, clock=clock):
        arrived = clock.now()
        await clock.sleep(RISE_COALESCE_S)
    registry.demand_rose.clear()
    return arrived


async def _signal(client: Client, *, model: Model, cluster: str, report: DemandReport) -> bool:
    """Send `report`; False when it did not arrive and is worth sending again (a
    model without a workflow has no one to tell: its wake starts one)."""
    try:
        await workflow_client.report_demand(
            client,
            deployment=model.ref(cluster=cluster),
            report=report,
            rpc_timeout=REPORT_RPC_TIMEOUT,
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return True
        log.warning("reporting demand for %s failed: %s", model.key, exc)
        return False
    except Exception as exc:  # Temporal away: a rise again after the gap, the rest next period
        log.warning("reporting demand for %s failed: %s", model.key, exc)
        return False
    return True
