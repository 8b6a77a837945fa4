"""Built-in autoscaling: how many replicas a ModelDeployment's demand asks for, and
how often gateways must tell its workflow about that demand.

Demand is what the gateways hold for the model: requests in flight to its replicas
plus requests queued for a replica or a free slot, summed over every gateway's
latest report. One replica serves `slots` requests at once (`runtime.concurrency`),
so demand D wants ceil(D / (slots * target)) replicas, `target` being the share of
slots a replica should have busy (`scaling.targetUtilizationPercent`, default 80).

The rule (`decide_scale`), between `minReplicas` and `maxReplicas`:

- **up** when the demand of the whole `scaleUpWindow` asked for more replicas than
  there are: straight to what the *lowest* demand of the window asks for, so one
  spike does not scale and a sustained load scales in one step;
- **down** one replica at a time, when the *highest* demand of the whole
  `scaleDownWindow` asks for fewer replicas and no scale (by Kama, `kubectl scale` or
  anyone) happened within that window; never below the replicas that still have a
  request in flight, never below one while there was demand (to zero only after
  `idleTimeout` without any request, as before), never below `minReplicas`.

A `kubectl scale` inside the bounds is therefore kept for at least `scaleDownWindow`,
and after that as long as demand asks for at least as many replicas; a scale above
what demand asks for is undone one replica per window. No demand, no scale up: a
model nobody calls is left where its owner put it until its idle timeout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

# gateways report a model's demand when it changes, and while it is not zero at least
# once a period: a quarter of the shortest window that reads it, kept within bounds
REPORT_PERIOD_MIN = timedelta(seconds=5)
REPORT_PERIOD_MAX = timedelta(seconds=60)
# a gateway silent for this many periods is gone (crashed, scaled in): its demand ends
REPORT_PERIODS_UNTIL_STALE = 3
# a rise is dated back by its report's `risen_for_s`, at most this much (a report
# held up longer than that says more about the path than about the load)
MAX_RISE_AGE = timedelta(seconds=1)


@dataclass(frozen=True)
class ScalingRule:
    min_replicas: int
    max_replicas: int
    slots: int  # concurrent requests per replica
    target_percent: int
    scale_up_window: timedelta
    scale_down_window: timedelta


@dataclass(frozen=True)
class DemandPoint:
    """From `at` until the next point, the model's demand was `demand`."""

    at: datetime
    demand: int


@dataclass(frozen=True)
class ScalingDecision:
    replicas: int
    reason: str


def replicas_for(demand: int, *, slots: int, target_percent: int) -> int:
    """The replicas `demand` concurrent requests want at the target utilisation."""
    if demand <= 0:
        return 0
    return math.ceil(demand * 100 / (max(slots, 1) * target_percent))


def report_period(*, idle_timeout: timedelta, scale_down_window: timedelta) -> timedelta:
    """How often a gateway repeats an unchanged, non-zero demand report: never more
    than half the idleTimeout, whatever the floor, so a busy model is always heard
    from before it would idle down."""
    quarter = min(idle_timeout, scale_down_window) / 4
    return min(max(REPORT_PERIOD_MIN, min(REPORT_PERIOD_MAX, quarter)), idle_timeout / 2)


def demand_levels(
    history: Sequence[DemandPoint], *, since: datetime, now: datetime
) -> list[int] | None:
    """Every demand level the model had between `since` and `now`; None when the
    history does not reach back to `since` (too new to judge the window)."""
    if not history or history[0].at > since:
        return None
    levels: list[int] = []
    for point, following in zip(history, [*history[1:], None], strict=True):
        ends = following.at if following is not None else now
        if ends > since or following is None:
            levels.append(point.demand)
    return levels


def decide_scale(
    *,
    rule: ScalingRule,
    history: Sequence[DemandPoint],
    current: int,
    busy_replicas: int,
    last_scaled: datetime | None,
    now: datetime,
) -> ScalingDecision | None:
    """The replica count demand asks for now, or None to leave `current` as it is."""
    if current <= 0:
        return None  # at zero only a request (the wake) brings a replica back
    up = demand_levels(history, since=now - rule.scale_up_window, now=now)
    if up is not None:
        sustained = min(up)
        wanted = min(
            rule.max_replicas,
            replicas_for(sustained, slots=rule.slots, target_percent=rule.target_percent),
        )
        if wanted > current:
            return ScalingDecision(
                wanted,
                f"{sustained} requests in flight or queued for {_span(rule.scale_up_window)}"
                f" want {wanted} replicas of {rule.slots} slots at {rule.target_percent}%",
            )
    if last_scaled is not None and now - last_scaled < rule.scale_down_window:
        return None
    down = demand_levels(history, since=now - rule.scale_down_window, now=now)
    if down is None:
        return None
    peak = max(down)
    floor = max(rule.min_replicas, busy_replicas, 1 if peak > 0 else 0)
    wanted = max(
        floor,
        min(
            rule.max_replicas,
            replicas_for(peak, slots=rule.slots, target_percent=rule.target_percent),
        ),
    )
    if wanted < current and current - 1 >= max(floor, 1):
        return ScalingDecision(
            current - 1,
            f"at most {peak} requests in flight or queued for"
            f" {_span(rule.scale_down_window)} want {wanted} replicas",
        )
    return None


def next_decision_due(
    *,
    rule: ScalingRule,
    history: Sequence[DemandPoint],
    last_scaled: datetime | None,
    now: datetime,
) -> datetime | None:
    """The next time `decide_scale` may decide differently without new demand: a
    window closing behind a demand change or a scale; None when nothing is pending."""
    if not history:
        return None
    ends = [at + window for at in (p.at for p in history) for window in _windows(rule)]
    if last_scaled is not None:
        ends.append(last_scaled + rule.scale_down_window)
    later = [end for end in ends if end > now]
    return min(later) if later else None


def _windows(rule: ScalingRule) -> tuple[timedelta, timedelta]:
    return rule.scale_up_window, rule.scale_down_window


def prune_history(
    history: Sequence[DemandPoint], *, keep: timedelta, now: datetime
) -> list[DemandPoint]:
    """The points that still matter for windows up to `keep` long: those inside it and
    the last one before it (the level the window starts with)."""
    cut = now - keep
    inside = [p for p in history if p.at > cut]
    before = [p for p in history if p.at <= cut]
    return ([before[-1]] if before else []) + inside


def compact_history(
    history: Sequence[DemandPoint], *, rule: ScalingRule, now: datetime
) -> list[DemandPoint]:
    """The history pruned to the windows (`prune_history`) and compacted, so that a
    day-long scaleDownWindow of a demand changing every second stays a few hundred
    points, with every decision unchanged.

    Before the scale-up window (where only the scale-down window's *peak* can still
    matter), a level followed by an equal or higher one can never be a peak again:
    any window that still holds part of it also holds the start of the higher one.
    So the higher level takes over its interval (starts at its time) and it goes.
    What remains there is strictly decreasing; the scale-up window, whose *minimum*
    decides, and the latest change are kept as they are."""
    kept = prune_history(history, keep=max(_windows(rule)), now=now)
    up_cut = now - rule.scale_up_window
    compacted: list[DemandPoint] = []
    for point in kept[:-1]:
        if point.at <= up_cut:
            while compacted and compacted[-1].demand <= point.demand:
                point = DemandPoint(compacted.pop().at, point.demand)
        compacted.append(point)
    return compacted + kept[-1:]


def total_demand(
    reports: Mapping[str, tuple[datetime, int]], *, stale_after: timedelta, now: datetime
) -> int:
    """The demand of every gateway whose latest report is still fresh."""
    return sum(demand for at, demand in reports.values() if now - at <= stale_after)


def _span(window: timedelta) -> str:
    seconds = int(window.total_seconds())
    return f"{seconds // 60}m{seconds % 60}s" if seconds >= 60 else f"{seconds}s"
