"""Which replica takes the next request: only one where this gateway has fewer
requests in flight than it has slots (llama-server serves HTTP on `slots` + 4
threads, so a request beyond its slots may wait for a thread rather than in its
queue; the gateway queues it instead, see `ModelRegistry.wait_for_slot`); among
those, one that recently timed out a connection only if nothing else is left, then
the least slot pressure ((this gateway's in-flight + other gateways' requests
there) / slots), ties broken by recent latency, then by how many requests each has
served. Pure; it declares the little it reads of an endpoint, so the registry can
call it without an import cycle.

With affinity keys (`PrefixAffinity` routing, `gateway.affinity`), the replicas are
ranked for the request: first the one that served its conversation or shared prefix
last (`gateway.served_prefixes`: its prompt cache may hold it), else the one its
shared prefix (the system prompt) hashes to highest, then the others by rendezvous
hashing of its conversation with each pod's name. So users of one system prompt
share a replica and its cached prefix, a conversation that has to leave it goes to
the same next replica on every turn, and only the keys of a replica that leaves or
arrives move. The first in that order whose
load stays within LOAD_BOUND times the average (counting this request) is the
request's home (consistent hashing with bounded loads, Mirrokni et al. 2018), so one
hot prefix spills over instead of queueing on one replica. The home is chosen among
every routable replica, full or not, a replica's load counting the requests waiting
for it as their home: a full home within the bound that served the request's
prefix last, or the first request to wait for it whatever the bound (at low load
the bound is one request a replica), is worth a short wait (the registry waits up
to `HOME_WAIT_S` for a slot there) rather than a prefill of the whole prompt
elsewhere; a home that never held it is not; after that wait, the request spills
to the first replica in the same order with a free slot (again within the bound
among those)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Iterable
from typing import Protocol, TypeVar

from gateway.affinity import Affinity

LOAD_BOUND = 1.25
# How long a request may wait for a slot on its full home before it spills. A spill
# pays the prefill of the whole prompt elsewhere: for a few thousand tokens of system
# prompt and conversation about a second on a GPU (the benchmark's 1,500 tokens take
# ~1 s on one CPU core), while a busy replica of several slots frees one every
# (request time / slots), usually well within it. Longer, and a full replica's
# waiters lose more than its cache saves them; the bounded-load rule already sends
# requests elsewhere when the home is busier than the rest.
HOME_WAIT_S = 1.0


class Candidate(Protocol):
    pod: str
    slots: int
    in_flight: int
    latency_s: float
    served: int
    unreachable_until: float
    homed: int  # requests waiting for a slot here, as their home

    def pressure(self) -> float: ...

    def load(self) -> int: ...


C = TypeVar("C", bound=Candidate)


def choose_endpoint(
    endpoints: Iterable[C],
    *,
    exclude: Collection[str],
    now: float,
    affinity: Affinity | None = None,
    remembered: str | None = None,
    wait_for_home: bool = False,
) -> C | None:
    """The replica with a free slot to take the request now, or None. With
    `affinity`: its home if that has a free slot; if the home is full, None when the
    caller will wait for it (`wait_for_home`) and the home is `remembered` (the
    replica that served its prefix last, whose cache may hold it), else the first free
    one in its order."""
    if affinity is not None:
        return _with_affinity(
            list(endpoints),
            exclude=exclude,
            now=now,
            affinity=affinity,
            remembered=remembered,
            wait_for_home=wait_for_home,
        )
    candidates = [e for e in endpoints if _free(e) and e.pod not in exclude]
    if len(candidates) < 2:  # the common case at low scale: nothing to compare
        return candidates[0] if candidates else None
    return min(
        candidates,
        key=lambda e: (e.unreachable_until > now, e.pressure(), e.latency_s, e.served, e.pod),
    )


def _with_affinity(
    endpoints: list[C],
    *,
    exclude: Collection[str],
    now: float,
    affinity: Affinity,
    remembered: str | None,
    wait_for_home: bool,
) -> C | None:
    """`choose_endpoint` for a request with affinity keys."""
    home = home_endpoint(
        endpoints, exclude=exclude, now=now, affinity=affinity, remembered=remembered
    )
    if home is None or _free(home):
        return home
    if wait_for_home and home.pod == remembered:
        return None
    free = [e for e in endpoints if _free(e) and e.pod not in exclude]  # the home is full
    if len(free) < 2:
        return free[0] if free else None
    reachable = [e for e in free if e.unreachable_until <= now] or free
    return by_affinity(reachable, affinity=affinity, remembered=remembered)


def home_endpoint(
    endpoints: Iterable[C],
    *,
    exclude: Collection[str],
    now: float,
    affinity: Affinity,
    remembered: str | None = None,
) -> C | None:
    """The request's home among every routable replica it may use, full or not (those
    that recently timed out a connection only if nothing else is left)."""
    routable = _routable(endpoints, exclude=exclude, now=now)
    if not routable:
        return None
    return by_affinity(routable, affinity=affinity, remembered=remembered)


def by_affinity(candidates: list[C], *, affinity: Affinity, remembered: str | None = None) -> C:
    """The first of `candidates` in the request's order (`ranked`) whose load, with
    this request, stays within LOAD_BOUND times the average, or that this request
    would be the first to wait for (`_first_to_wait`). A replica's load counts the
    requests waiting for it as their home: a hot prefix's queue at its home is
    bounded too, and the requests past it spill at once rather than after a wait."""
    total = sum(_load(e) for e in candidates) + 1
    bound = math.ceil(LOAD_BOUND * total / len(candidates))
    ordered = ranked(candidates, affinity=affinity, remembered=remembered)
    for endpoint in ordered:
        if _load(endpoint) + 1 <= bound or _first_to_wait(endpoint, remembered=remembered):
            return endpoint
    return min(ordered, key=lambda e: e.pressure())  # unreachable with bound >= average


def ranked(candidates: list[C], *, affinity: Affinity, remembered: str | None = None) -> list[C]:
    """The replica that served the request's prefix last (`remembered`, when it is a
    candidate), else the shared prefix's replica; then the others in the
    conversation's rendezvous order (with no system prompt both keys are one, and this
    is plain rendezvous)."""
    first = next((e for e in candidates if e.pod == remembered), None)
    if first is None:
        first = max(candidates, key=lambda e: _weight(affinity.prefix, e.pod))
    rest = sorted(
        (e for e in candidates if e is not first),
        key=lambda e: _weight(affinity.conversation, e.pod),
        reverse=True,
    )
    return [first, *rest]


def _first_to_wait(endpoint: Candidate, *, remembered: str | None) -> bool:
    """Whether `endpoint` is the full replica that served the request's prefix last,
    with no request waiting for it yet: the first such request may wait for it
    whatever the bound says. At low load the bound is a single request (four one-slot
    replicas, one busy: 1.25 x 2/4 rounds up to 1), so without this a conversation
    whose replica is busy would never wait for it, and would prefill all its turns
    again elsewhere rather than wait a moment for the slot that holds them."""
    return endpoint.pod == remembered and not _free(endpoint) and endpoint.homed == 0


def _routable(endpoints: Iterable[C], *, exclude: Collection[str], now: float) -> list[C]:
    allowed = [e for e in endpoints if e.pod not in exclude]
    return [e for e in allowed if e.unreachable_until <= now] or allowed


def _load(endpoint: Candidate) -> int:
    return endpoint.load() + endpoint.homed


def _free(endpoint: Candidate) -> bool:
    return endpoint.in_flight < endpoint.slots


def _weight(key: bytes, pod: str) -> bytes:
    return hashlib.blake2b(key + pod.encode(), digest_size=8).digest()
