"""What a DeploymentWorkflow remembers of its model's demand between passes and across
continue-as-new: each gateway's latest report, the recent history of the total, and
when the replica count last changed. Times are ISO strings so the ledger travels as
plain JSON in the workflow's memory; `kama.autoscaling` decides from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from kama.api.deployment import ModelDeploymentSpec
from kama.autoscaling import (
    MAX_RISE_AGE,
    REPORT_PERIODS_UNTIL_STALE,
    DemandPoint,
    ScalingDecision,
    ScalingRule,
    compact_history,
    decide_scale,
    next_decision_due,
    report_period,
)
from kama.durations import parse_duration


def scaling_rule(spec: ModelDeploymentSpec) -> ScalingRule:
    scaling = spec.scaling
    return ScalingRule(
        min_replicas=scaling.min_replicas,
        max_replicas=scaling.max_replicas,
        slots=spec.runtime.concurrency,
        target_percent=scaling.target_utilization_percent,
        scale_up_window=parse_duration(scaling.scale_up_window),
        scale_down_window=parse_duration(scaling.scale_down_window),
    )


def stale_after(spec: ModelDeploymentSpec) -> timedelta:
    """How long a gateway may stay silent before its last report no longer counts."""
    period = report_period(
        idle_timeout=parse_duration(spec.scaling.idle_timeout),
        scale_down_window=parse_duration(spec.scaling.scale_down_window),
    )
    return period * REPORT_PERIODS_UNTIL_STALE


@dataclass
class GatewayDemand:
    at: str
    demand: int
    busy_pods: list[str] = field(default_factory=list)


@dataclass
class DemandSample:
    at: str
    demand: int


@dataclass
class DemandLedger:
    gateways: dict[str, GatewayDemand] = field(default_factory=dict)
    history: list[DemandSample] = field(default_factory=list)
    last_scaled: str | None = None  # when spec.replicas last changed (anyone's scale)

    def record(
        self,
        *,
        gateway: str,
        demand: int,
        busy_pods: list[str],
        now: datetime,
        risen_for: timedelta = timedelta(0),
    ) -> bool:
        """Take one gateway's report; whether the total changed. A rise the gateway
        saw `risen_for` ago (at most MAX_RISE_AGE) is dated then, but never before the
        history's last change (the total's order stays the order of its changes)."""
        before = self.total()
        self.gateways[gateway] = GatewayDemand(now.isoformat(), demand, sorted(busy_pods))
        since = now - min(max(risen_for, timedelta(0)), MAX_RISE_AGE)
        if self.history:
            since = max(since, datetime.fromisoformat(self.history[-1].at))
        return self._note(before=before, now=since)

    def expire(self, *, stale_after: timedelta, now: datetime) -> bool:
        """Forget gateways silent for `stale_after` (gone); whether the total changed."""
        before = self.total()
        for name, report in list(self.gateways.items()):
            if now - datetime.fromisoformat(report.at) > stale_after:
                del self.gateways[name]
        return self._note(before=before, now=now)

    def scaled(self, *, now: datetime) -> None:
        self.last_scaled = now.isoformat()

    def total(self) -> int:
        return sum(report.demand for report in self.gateways.values())

    def busy_replicas(self) -> int:
        """Serving pods with a request in flight from any gateway."""
        return len({pod for report in self.gateways.values() for pod in report.busy_pods})

    def decide(
        self, *, rule: ScalingRule, current: int, now: datetime
    ) -> tuple[ScalingDecision | None, datetime | None]:
        """What demand asks of the replica count now, and when to look again."""
        self._prune(rule=rule, now=now)
        history = self._points()
        last = datetime.fromisoformat(self.last_scaled) if self.last_scaled else None
        decision = decide_scale(
            rule=rule,
            history=history,
            current=current,
            busy_replicas=self.busy_replicas(),
            last_scaled=last,
            now=now,
        )
        due = next_decision_due(rule=rule, history=history, last_scaled=last, now=now)
        return decision, due

    def _note(self, *, before: int, now: datetime) -> bool:
        total = self.total()
        if self.history and total == before:
            return False
        self.history.append(DemandSample(now.isoformat(), total))
        return True

    def _points(self) -> list[DemandPoint]:
        return [DemandPoint(datetime.fromisoformat(s.at), s.demand) for s in self.history]

    def _prune(self, *, rule: ScalingRule, now: datetime) -> None:
        kept = compact_history(self._points(), rule=rule, now=now)
        self.history = [DemandSample(p.at.isoformat(), p.demand) for p in kept]
