"""Which replica takes the next request: the least slot pressure
((this gateway's in-flight + other gateways' requests there) / slots), ties broken
by recent latency, then by how many requests each has served. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from gateway.registry import Endpoint


def choose_endpoint(endpoints: Iterable[Endpoint], *, exclude: frozenset[str]) -> Endpoint | None:
    candidates = [e for e in endpoints if e.pod not in exclude]
    if len(candidates) < 2:  # the common case at low scale: nothing to compare
        return candidates[0] if candidates else None
    return min(candidates, key=lambda e: (e.pressure(), e.latency_s, e.served, e.pod))
