"""Which replica takes the next request: only one where this gateway has fewer
requests in flight than it has slots (llama-server serves HTTP on `slots` + 4
threads, so a request beyond its slots may wait for a thread rather than in its
queue; the gateway queues it instead, see `ModelRegistry.wait_for_slot`); among
those, one that recently timed out a connection only if nothing else is left, then
the least slot pressure ((this gateway's in-flight + other gateways' requests
there) / slots), ties broken by recent latency, then by how many requests each has
served. Pure; it declares the little it reads of an endpoint, so the registry can
call it without an import cycle.

With an affinity key (`PrefixAffinity` routing, `gateway.affinity`), replicas are
ranked by rendezvous hashing of the key with each pod's name, so a conversation keeps
going to the replica that holds its prefix in cache and only the keys of a replica
that leaves or arrives move; the first in that order whose load stays within
LOAD_BOUND times the average (counting this request) takes it, so one hot prefix
spills over to the next replica instead of queueing on one (consistent hashing with
bounded loads, Mirrokni et al. 2018)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Iterable
from typing import Protocol, TypeVar

LOAD_BOUND = 1.25


class Candidate(Protocol):
    pod: str
    slots: int
    in_flight: int
    latency_s: float
    served: int
    unreachable_until: float

    def pressure(self) -> float: ...

    def load(self) -> int: ...


C = TypeVar("C", bound=Candidate)


def choose_endpoint(
    endpoints: Iterable[C], *, exclude: Collection[str], now: float, affinity: bytes | None = None
) -> C | None:
    candidates = [e for e in endpoints if e.in_flight < e.slots and e.pod not in exclude]
    if len(candidates) < 2:  # the common case at low scale: nothing to compare
        return candidates[0] if candidates else None
    if affinity is not None:
        reachable = [e for e in candidates if e.unreachable_until <= now] or candidates
        return by_affinity(reachable, key=affinity)
    return min(
        candidates,
        key=lambda e: (e.unreachable_until > now, e.pressure(), e.latency_s, e.served, e.pod),
    )


def by_affinity(candidates: list[C], *, key: bytes) -> C:
    """The first of `candidates` in the key's rendezvous order whose load, with this
    request, stays within LOAD_BOUND times the average."""
    total = sum(e.load() for e in candidates) + 1
    bound = math.ceil(LOAD_BOUND * total / len(candidates))
    ranked = sorted(candidates, key=lambda e: _weight(key, e.pod), reverse=True)
    for endpoint in ranked:
        if endpoint.load() + 1 <= bound:
            return endpoint
    return min(ranked, key=lambda e: e.pressure())  # unreachable with bound >= average


def _weight(key: bytes, pod: str) -> bytes:
    return hashlib.blake2b(key + pod.encode(), digest_size=8).digest()
