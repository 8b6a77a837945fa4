"""PrefixAffinity requests and their home replica when it is full: the home is chosen
among every replica, full or not; a request waits for a slot there up to the home
wait, then takes any, but only when the home served its prefix before (a prefix never
cached there takes a free slot at once, and after a spill the replica it spilled to
holds it); a queued request keeps its keys and gets its home's freed slot
ahead of an older request waiting for another home, but not once that one's home wait
is over; the first request for a full home waits for it even when the load bound
would spill it (at low load the bound is one request a replica), the next ones only
within the bound; requests without affinity queue as before. Time is a
`ManualClock`: nothing sleeps."""

from __future__ import annotations

import asyncio

from gateway.affinity import Affinity, affinity_key
from gateway.proxy import Proxy
from gateway.registry import Lease, Model, ModelRegistry
from gateway.routing import HOME_WAIT_S, ranked
from gateway.transport.upstream import UpstreamTransport
from tests.unit.gateway_support import ManualClock, NoWake, deployment, pod

WAIT = 1.0  # the home wait these tests give the registry


def affinity_model(
    *, slots: int, replicas: int = 2, home_wait_s: float = WAIT
) -> tuple[ModelRegistry, Model, ManualClock]:
    clock = ManualClock()
    registry = ModelRegistry(clock=clock, home_wait_s=home_wait_s)
    spec = deployment("chat")
    spec["spec"]["routing"] = {"strategy": "PrefixAffinity"}
    registry.apply_deployment("ADDED", spec)
    for n in range(replicas):
        registry.apply_pod("ADDED", pod(f"p{n}", ip=f"10.0.0.{n + 1}", slots=slots))
    model = registry.resolve("ns/chat")
    assert model is not None and model.prefix_affinity
    return registry, model, clock


def homed_at(model: Model, name: str, *, skip: int = 0) -> Affinity:
    """The keys of a tenant whose system prompt ranks replica `name` first."""
    endpoints = list(model.endpoints.values())
    found = 0
    for n in range(1000):
        messages = [{"role": "system", "content": f"tenant {n}"}, {"role": "user", "content": "hi"}]
        key = affinity_key({"messages": messages})
        assert key is not None
        if ranked(endpoints, affinity=key)[0].pod == name:
            if found == skip:
                return key
            found += 1
    raise AssertionError(f"no key ranks {name} first")


def cached_at(model: Model, name: str, *, skip: int = 0) -> Affinity:
    """The keys of a tenant homed at `name` whose prefix `name` served before, so its
    prompt cache may hold it: a home worth waiting for."""
    key = homed_at(model, name, skip=skip)
    model.served_prefixes.record(key, name)
    return key


def take(registry: ModelRegistry, model: Model, pod_name: str) -> Lease:
    """A request in flight on `pod_name` (a key homed there while it has room)."""
    lease = registry.acquire(
        model, route="chat", exclude=(), now=0.0, affinity=homed_at(model, pod_name)
    )
    assert lease is not None and lease.endpoint.pod == pod_name
    return lease


def waiting(
    registry: ModelRegistry, model: Model, key: Affinity | None
) -> asyncio.Task[Lease | None]:
    return asyncio.create_task(
        registry.wait_for_slot(model, route="chat", exclude=(), affinity=key)
    )


def assert_idle(model: Model) -> None:
    assert model.in_flight == 0 and not model.slot_waiters
    assert all(e.in_flight == 0 and e.homed == 0 for e in model.endpoints.values())


def test_the_home_wait_is_a_second() -> None:
    assert HOME_WAIT_S == 1.0 and ModelRegistry().home_wait_s == HOME_WAIT_S


async def test_a_full_home_is_waited_for_then_the_request_spills() -> None:
    registry, model, clock = affinity_model(slots=2)
    home = [take(registry, model, "p0"), take(registry, model, "p0")]  # p0 full
    elsewhere = take(registry, model, "p1")  # loads 2 and 1: p0 stays within the bound
    key = cached_at(model, "p0", skip=1)
    # the old router dropped full p0 before ranking and sent this to p1 at once
    assert registry.acquire(model, route="chat", exclude=(), now=0.0, affinity=key) is None
    request = waiting(registry, model, key)
    await clock.advance(WAIT * 0.99)
    assert not request.done()  # p1 has a free slot, but this request waits for p0
    await clock.advance(WAIT * 0.01)
    spilled = await request  # the wait is bounded: then the free slot elsewhere
    assert spilled is not None and spilled.endpoint.pod == "p1"
    for lease in [*home, elsewhere, spilled]:
        lease.release()
    assert_idle(model)


async def test_a_slot_freed_on_the_home_within_the_wait_goes_to_its_waiter() -> None:
    registry, model, clock = affinity_model(slots=2)
    home = [take(registry, model, "p0"), take(registry, model, "p0")]
    elsewhere = take(registry, model, "p1")
    request = waiting(registry, model, cached_at(model, "p0", skip=1))
    await clock.advance(WAIT / 2)
    home[0].release()
    await clock.settle()
    lease = request.result()
    assert lease is not None and lease.endpoint.pod == "p0"
    for done in [home[1], elsewhere, lease]:
        done.release()
    await clock.advance(WAIT)  # its timer is gone with it: nothing left to grant
    assert_idle(model)


async def test_a_busy_one_slot_home_is_waited_for_even_at_low_load() -> None:
    registry, model, clock = affinity_model(slots=1, replicas=4)
    busy = take(registry, model, "p0")  # another conversation's turn on p0
    key = cached_at(model, "p0", skip=1)  # p0 served this conversation's last turn
    # one request in flight over four one-slot replicas: by the bound alone p0 is busier
    # than 1.25 x the average, and the old router sent this turn to an idle replica at
    # once, to prefill the whole conversation there
    assert registry.acquire(model, route="chat", exclude=(), now=0.0, affinity=key) is None
    request = waiting(registry, model, key)
    await clock.advance(WAIT / 4)
    assert not request.done()
    busy.release()
    await clock.settle()
    lease = request.result()
    assert lease is not None and lease.endpoint.pod == "p0"
    lease.release()
    assert_idle(model)


async def test_past_its_first_waiter_a_home_busier_than_the_bound_is_not_waited_for() -> None:
    registry, model, clock = affinity_model(slots=2)
    home = [take(registry, model, "p0"), take(registry, model, "p0")]  # p1 idle
    key = cached_at(model, "p0", skip=1)
    first = waiting(registry, model, key)  # the first may wait for its full home
    await clock.settle()
    assert not first.done() and model.endpoints["p0"].homed == 1
    lease = registry.acquire(model, route="chat", exclude=(), now=0.0, affinity=key)
    assert lease is not None and lease.endpoint.pod == "p1"  # 2 + 1 + 1 > 1.25 x 4/2: now
    home[0].release()
    await clock.settle()
    waited = first.result()
    assert waited is not None and waited.endpoint.pod == "p0"
    for done in [home[1], lease, waited]:
        done.release()
    assert_idle(model)


async def test_requests_waiting_for_a_home_count_in_its_load() -> None:
    registry, model, clock = affinity_model(slots=2)
    home = [take(registry, model, "p0"), take(registry, model, "p0")]
    elsewhere = take(registry, model, "p1")
    key = cached_at(model, "p0", skip=1)  # one hot prefix
    queued = [waiting(registry, model, key) for _ in range(2)]
    await clock.settle()
    assert not any(q.done() for q in queued) and model.endpoints["p0"].homed == 2
    spilled = waiting(registry, model, key)  # p0: 2 + 2 waiting + 1 > 1.25 x 6/2
    await clock.settle()
    lease = spilled.result()
    assert lease is not None and lease.endpoint.pod == "p1"  # at once, no wait
    home[0].release()
    await clock.settle()
    first = queued[0].result()
    assert first is not None and first.endpoint.pod == "p0"
    assert model.endpoints["p0"].homed == 1
    await clock.advance(WAIT)  # p1 is full too now: the second waits on, for any slot
    assert not queued[1].done() and model.endpoints["p0"].homed == 0
    elsewhere.release()
    await clock.settle()
    last = queued[1].result()
    assert last is not None and last.endpoint.pod == "p1"
    for done in [home[1], lease, first, last]:
        done.release()
    assert_idle(model)


async def test_a_queued_request_gets_its_homes_slot_ahead_of_an_older_one_homed_elsewhere() -> None:
    registry, model, clock = affinity_model(slots=1)
    on_p0, on_p1 = take(registry, model, "p0"), take(registry, model, "p1")  # both full
    older = waiting(registry, model, cached_at(model, "p1", skip=1))
    await clock.advance(WAIT / 4)
    newer = waiting(registry, model, cached_at(model, "p0", skip=1))
    await clock.settle()
    on_p0.release()  # p0 frees: the newer request's home, the older one's is p1
    await clock.settle()
    got = newer.result()
    assert got is not None and got.endpoint.pod == "p0" and not older.done()
    on_p1.release()
    await clock.settle()
    mine = older.result()
    assert mine is not None and mine.endpoint.pod == "p1"  # its own home, in time
    got.release()
    mine.release()
    assert_idle(model)


async def test_past_its_home_wait_an_older_request_takes_any_slot_first() -> None:
    registry, model, clock = affinity_model(slots=1)
    on_p0, on_p1 = take(registry, model, "p0"), take(registry, model, "p1")
    older = waiting(registry, model, cached_at(model, "p1", skip=1))
    await clock.advance(WAIT)  # its home wait is over: it may take any replica now
    newer = waiting(registry, model, cached_at(model, "p0", skip=1))
    await clock.settle()
    on_p0.release()
    await clock.settle()
    first = older.result()  # no starvation: the older one, though p0 is the newer's home
    assert first is not None and first.endpoint.pod == "p0" and not newer.done()
    on_p1.release()  # not the newer request's home, and it is still within its wait
    await clock.settle()
    assert not newer.done()
    await clock.advance(WAIT)
    second = newer.result()
    assert second is not None and second.endpoint.pod == "p1"
    first.release()
    second.release()
    assert_idle(model)


async def test_a_request_that_leaves_during_its_home_wait_leaves_the_queue() -> None:
    registry, model, clock = affinity_model(slots=1)
    on_p0, on_p1 = take(registry, model, "p0"), take(registry, model, "p1")
    gone = waiting(registry, model, cached_at(model, "p0", skip=1))
    later = waiting(registry, model, cached_at(model, "p0", skip=2))
    await clock.settle()
    gone.cancel()  # its client left while it waited for its home
    await clock.settle()
    on_p0.release()
    await clock.settle()
    lease = later.result()
    assert gone.cancelled() and lease is not None and lease.endpoint.pod == "p0"
    assert model.in_flight == 2 and not model.slot_waiters
    lease.release()
    on_p1.release()
    assert_idle(model)


async def test_a_home_that_leaves_routing_frees_its_waiters_at_once() -> None:
    registry, model, clock = affinity_model(slots=1, replicas=3)
    on = {name: take(registry, model, name) for name in ("p0", "p1", "p2")}
    request = waiting(registry, model, cached_at(model, "p0", skip=1))
    await clock.settle()
    on["p2"].release()  # a free slot, not its home's
    await clock.settle()
    assert not request.done()
    registry.apply_pod("DELETED", pod("p0", ip="10.0.0.1", slots=1))
    await clock.settle()
    lease = request.result()
    assert lease is not None and lease.endpoint.pod == "p2"
    for done in (lease, on["p0"], on["p1"]):
        done.release()


async def test_requests_without_affinity_take_any_free_slot_in_arrival_order() -> None:
    registry, model, clock = affinity_model(slots=1)
    first = registry.acquire(model, route="chat", exclude=(), now=0.0)
    assert first is not None
    second = registry.acquire(model, route="chat", exclude=(), now=0.0)  # the other, at once
    assert second is not None and second.endpoint is not first.endpoint
    queued = [waiting(registry, model, None) for _ in range(2)]
    await clock.settle()
    second.release()
    await clock.settle()
    taken = queued[0].result()  # no home and no timer: the longest waiting, at once
    assert taken is not None and taken.endpoint is second.endpoint and not queued[1].done()
    first.release()
    await clock.settle()
    last = queued[1].result()
    assert last is not None and last.endpoint is first.endpoint
    taken.release()
    last.release()
    assert_idle(model)


async def test_no_home_wait_means_the_old_spill_at_once() -> None:
    registry, model, _ = affinity_model(slots=2, home_wait_s=0)
    home = [take(registry, model, "p0"), take(registry, model, "p0")]
    elsewhere = take(registry, model, "p1")
    key = cached_at(model, "p0", skip=1)
    lease = registry.acquire(model, route="chat", exclude=(), now=0.0, affinity=key)
    assert lease is not None and lease.endpoint.pod == "p1"
    for done in [*home, elsewhere, lease]:
        done.release()


async def test_a_request_that_may_not_queue_spills_rather_than_a_429() -> None:
    registry, model, _ = affinity_model(slots=2)
    proxy = Proxy(registry=registry, upstream=UpstreamTransport(), waker=NoWake())
    home = [take(registry, model, "p0"), take(registry, model, "p0")]
    elsewhere = take(registry, model, "p1")
    model.max_queued = 0  # no request of this model may wait for a slot
    key = cached_at(model, "p0", skip=1)
    lease = await proxy._lease(model, route="chat", tried=set(), size=10, affinity=key)
    assert lease is not None and lease.endpoint.pod == "p1"
    for done in [*home, elsewhere, lease]:
        done.release()


async def test_a_prefix_its_home_never_served_takes_a_free_slot_at_once() -> None:
    registry, model, _ = affinity_model(slots=2)
    home = [take(registry, model, "p0"), take(registry, model, "p0")]
    elsewhere = take(registry, model, "p1")  # p0 within the bound, as when it is waited for
    fresh = homed_at(model, "p0", skip=1)  # homed at p0, never served anywhere
    lease = registry.acquire(model, route="chat", exclude=(), now=0.0, affinity=fresh)
    assert lease is not None and lease.endpoint.pod == "p1"  # no wait: nothing cached on p0
    for done in [*home, elsewhere, lease]:
        done.release()
    assert_idle(model)


async def test_after_a_spill_its_home_is_not_waited_for_again() -> None:
    registry, model, clock = affinity_model(slots=2)
    key = cached_at(model, "p0", skip=1)
    home = [take(registry, model, "p0"), take(registry, model, "p0")]
    elsewhere = take(registry, model, "p1")
    request = waiting(registry, model, key)
    await clock.advance(WAIT)
    spilled = await request
    assert spilled is not None and spilled.endpoint.pod == "p1"  # p1 now holds its prefix
    spilled.release()
    again = registry.acquire(model, route="chat", exclude=(), now=0.0, affinity=key)
    assert again is not None and again.endpoint.pod == "p1"  # at once, not after a wait
    for done in [*home, elsewhere, again]:
        done.release()
    assert_idle(model)


async def test_a_conversation_goes_back_to_the_replica_that_served_it_not_its_hash() -> None:
    registry, model, _ = affinity_model(slots=1)
    key = homed_at(model, "p0")
    model.served_prefixes.record(key, "p1")  # its last turn spilled to p1: cached there
    lease = registry.acquire(model, route="chat", exclude=(), now=0.0, affinity=key)
    assert lease is not None and lease.endpoint.pod == "p1"  # though p0 is free
    lease.release()
    assert_idle(model)
