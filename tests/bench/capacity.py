"""Capacity at a latency limit, read from a load sweep: the request rate at which a
strategy's p90 TTFT reaches the limit. Read as the highest swept rate within the limit
it moves in steps as coarse as the sweep's (loads 1.5x apart), so a miss by 0.4 ms
halves a strategy's capacity; read where the p90 crosses the limit, interpolated
between the two loads around the crossing, it moves with the latency. The benchmark
reports both. Pure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoadPoint:
    """One load of a sweep: the requests/s served and the p90 TTFT (ms) at it."""

    requests_per_s: float
    ttft_p90_ms: float
    errors: int = 0

    def within(self, limit_ms: float) -> bool:
        """Served without errors and with its p90 TTFT within `limit_ms`."""
        return self.ttft_p90_ms <= limit_ms and not self.errors


def capacity_within_limit(points: list[LoadPoint], *, limit_ms: float) -> float:
    """The highest requests/s of a load within `limit_ms` (and without errors); 0 when
    none is."""
    return max(
        (p.requests_per_s for p in points if p.within(limit_ms)),
        default=0.0,
    )


def capacity_at_limit(points: list[LoadPoint], *, limit_ms: float) -> float:
    """The requests/s at which the p90 TTFT first reaches `limit_ms`, with `points` in
    the order of rising load: interpolated linearly between the last load within the
    limit and the first beyond it. Never more than a load beyond the limit served and
    never less than the one within it; no crossing: the highest load within the limit
    (the sweep did not reach the limit, so that is all it can say); a first load
    already beyond the limit: 0. A load with errors counts as beyond the limit."""
    within: LoadPoint | None = None
    for point in points:
        if point.within(limit_ms):
            within = point
            continue
        if within is None:
            return 0.0
        if point.errors:  # no latency to interpolate towards
            return within.requests_per_s
        share = (limit_ms - within.ttft_p90_ms) / (point.ttft_p90_ms - within.ttft_p90_ms)
        rate = within.requests_per_s + share * (point.requests_per_s - within.requests_per_s)
        return max(within.requests_per_s, rate)
    return within.requests_per_s if within else 0.0
