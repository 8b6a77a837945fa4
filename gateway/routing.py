"""Which replica takes the next request: only one where this gateway has fewer
requests in flight than it has slots (llama-server serves HTTP on `slots` + 4
threads, so a request beyond its slots may wait for a thread rather than in its
queue; the gateway queues it instead, see `ModelRegistry.wait_for_slot`); among
those, one that recently timed out a connection only if nothing else is left, then
the least slot pressure ((this gateway's in-flight + other gateways' requests
there) / slots), ties broken by recent latency, then by how many requests each has
served. Pure; it declares the little it reads of an endpoint, so the registry can
call it without an import cycle."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol, TypeVar


class Candidate(Protocol):
    pod: str
    slots: int
    in_flight: int
    latency_s: float
    served: int
    unreachable_until: float

    def pressure(self) -> float: ...


C = TypeVar("C", bound=Candidate)


def choose_endpoint(endpoints: Iterable[C], *, exclude: Collection[str], now: float) -> C | None:
    candidates = [e for e in endpoints if e.in_flight < e.slots and e.pod not in exclude]
    if len(candidates) < 2:  # the common case at low scale: nothing to compare
        return candidates[0] if candidates else None
    return min(
        candidates,
        key=lambda e: (e.unreachable_until > now, e.pressure(), e.latency_s, e.served, e.pod),
    )
