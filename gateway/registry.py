"""What the gateway knows about models and their replicas, kept from watches.

ModelDeployments give names, aliases, scaling limits, the reason a model is not
serving and whether it cannot start at all (`gateway.deployment_status`); Kama's serving pods give endpoints (ready, not draining, not deleting,
with an IP and a slot count from their serving plan). Watch threads hand objects
to `apply_*` on the event loop; request handlers read. Waiters for a model at
zero are woken when its first endpoint appears.

A request takes its replica with `acquire`, which picks one and counts the request
in flight there (and in the model, and in the metrics) and hands back a `Lease`; the
lease's `release` is the only way those counts go down, and the proxy calls it once,
in a `finally` (kubeai's `AwaitBestAddress` returns its `done` the same way).

A replica takes at most `slots` requests from this gateway (see `gateway.routing`).
When every replica a request may use is full, or (`PrefixAffinity`) its home replica
is, `wait_for_slot` queues it in the model's queue, here where routing sees it. A
request with affinity keys keeps them while it waits, and its home (chosen when it
arrived): for up to `home_wait_s` it may take a slot on its home only, then any. It
waits for its home only when the home served its conversation or shared prefix last
(`gateway.served_prefixes`); a prefix never cached there takes any slot at once. A
freed slot goes to the longest waiting request that may take it: the oldest of those
waiting for that replica as their home and those that may take any replica. So a
request gets its home's slot ahead of an older one waiting for another home, but
once a request's home wait is over it is served in arrival order with every request
that may use any replica: nothing waits for a slot longer than `home_wait_s` plus
its turn in that order. Without affinity this is the plain FIFO queue: a release
hands its slot to the longest waiting request (which reuses the connection just
left idle), so a burst goes to whichever replica frees first.

With a master serving key, each endpoint carries its llama-server's Authorization
header value (`kama.serving_key`: derived from the pod's namespace and controlling
ModelDeployment's uid once, when the pod is placed), which the proxy and the load
poll send; requests then cost no key derivation."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gateway.adapters import Adapters, adapters_of
from gateway.affinity import Affinity
from gateway.aliases import alias_owners
from gateway.api_routes import serving_mode
from gateway.clock import MONOTONIC, Clock, wait_for_future
from gateway.deployment_status import cannot_start, not_serving_reason
from gateway.metrics import GatewayMetrics, RequestSeries
from gateway.routing import HOME_WAIT_S, choose_endpoint, home_endpoint
from gateway.served_prefixes import ServedPrefixes
from kama.api.deployment_choices import DEFAULT_SCALE_DOWN_WINDOW, ServingMode
from kama.autoscaling import report_period
from kama.contracts import ObjectRef
from kama.durations import parse_duration
from kama.serving_key import bearer, pod_serving_key
from kama.serving_pod import DEPLOYMENT_LABEL, DRAINING_LABEL, SERVING_PLAN_ENV

DEFAULT_COLD_START_S = 600.0
DEFAULT_MAX_QUEUED = 100
LATENCY_SMOOTHING = 0.2


@dataclass
class Endpoint:
    pod: str
    ip: str
    slots: int
    in_flight: int = 0
    others: int = 0  # requests other gateways have there (llama-server's view minus ours)
    latency_s: float = 0.0  # smoothed time to response headers
    served: int = 0
    early: bool = False  # confirmed by the supervisor's /readyz before the kubelet said Ready
    unreachable_until: float = 0.0  # a connection timed out: others first until then
    homed: int = 0  # requests waiting for a slot here as their home (PrefixAffinity)
    leaving: bool = False  # draining or deleted while requests were in flight here
    authorization: bytes | None = None  # its llama-server's key, as a header value

    def load(self) -> int:
        return self.in_flight + self.others

    def pressure(self) -> float:
        return self.load() / max(self.slots, 1)

    def observe_backend(self, *, held: int, ours: int) -> None:
        """llama-server said it holds `held` requests (processing + deferred) while
        this gateway had at most `ours` there. Only the difference is someone else's:
        counting our own would double them, and a poll is up to an interval old
        while our in-flight count is exact."""
        self.others = max(0, held - ours)

    def observe_latency(self, seconds: float) -> None:
        if self.latency_s == 0.0:
            self.latency_s = seconds
        else:
            self.latency_s += LATENCY_SMOOTHING * (seconds - self.latency_s)


@dataclass
class Model:
    namespace: str
    name: str
    uid: str
    aliases: tuple[str, ...] = ()
    max_queued: int = DEFAULT_MAX_QUEUED
    cold_start_s: float = DEFAULT_COLD_START_S
    reason: str = ""  # why it is not serving, for messages
    cannot_start: str | None = None  # why it cannot start a replica: requests fail fast
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    starting: dict[str, Endpoint] = field(default_factory=dict)  # running, not Ready yet
    held: int = 0  # requests waiting for a replica
    in_flight: int = 0
    requests_since_report: int = 0
    report_period_s: float = 60.0  # kama.autoscaling.report_period of its spec
    prefix_affinity: bool = False  # spec.routing.strategy PrefixAffinity
    mode: ServingMode = ServingMode.GENERATION  # spec.runtime.mode: the routes it serves
    context: int | None = None  # spec.runtime.contextSize: a request's most tokens
    remote_media: bool = False  # spec.routing.allowRemoteMediaUrls (gateway.media_urls)
    adapters: Adapters = ()  # spec.adapters: (name, scale) in llama-server's load order
    created: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    slot_waiters: deque[SlotWaiter] = field(default_factory=deque)  # every replica full
    served_prefixes: ServedPrefixes = field(default_factory=ServedPrefixes)  # PrefixAffinity

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def ref(self, *, cluster: str) -> ObjectRef:
        """The ModelDeployment, as its workflows (in `cluster`) know it."""
        return ObjectRef(namespace=self.namespace, name=self.name, uid=self.uid, cluster=cluster)


@dataclass(eq=False, slots=True)
class SlotWaiter:
    """A request waiting for a free slot on a replica it has not tried yet: only on
    `home` while that is set (its home wait), then on any."""

    route: str
    exclude: Collection[str]
    granted: asyncio.Future[Lease | None]
    affinity: Affinity | None = None
    home: Endpoint | None = None  # counted in its `homed` while set


def _slots(pod: dict[str, Any]) -> int:
    for container in pod.get("spec", {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == SERVING_PLAN_ENV and env.get("value"):
                return int(json.loads(env["value"]).get("concurrency", 1))
    return 1


def _pod_state(pod: dict[str, Any]) -> str:
    """ "routable" (Ready, not leaving), "starting" (running, not Ready yet) or "out"."""
    meta, status = pod.get("metadata", {}), pod.get("status") or {}
    leaving = (
        bool(meta.get("deletionTimestamp"))
        or (meta.get("labels") or {}).get(DRAINING_LABEL) == "true"
        or status.get("phase") != "Running"
        or not status.get("podIP")
    )
    if leaving:
        return "out"
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return "routable" if ready else "starting"


@dataclass(eq=False, slots=True)
class Lease:
    """One request's place on one replica, from `ModelRegistry.acquire` to `release`."""

    model: Model
    endpoint: Endpoint
    series: RequestSeries
    registry: ModelRegistry
    released: bool = False

    def release(self) -> None:
        """The request is over (answered, failed or abandoned); a second call does
        nothing. The freed slot goes to the longest waiting request that may take it
        (see the module's docstring), if any."""
        if self.released:
            return
        self.released = True
        self.endpoint.in_flight -= 1
        self.model.in_flight -= 1
        self.series.end()
        if self.endpoint.leaving and self.endpoint.in_flight == 0:
            self.registry.notify_drain(self.model, self.endpoint)
        if self.model.slot_waiters:
            self.registry.grant_slots(self.model)


class ModelRegistry:
    def __init__(
        self,
        *,
        metrics: GatewayMetrics | None = None,
        serving_key: str | None = None,
        clock: Clock = MONOTONIC,
        home_wait_s: float = HOME_WAIT_S,
    ) -> None:
        self.metrics = metrics or GatewayMetrics()
        self.clock = clock  # times the home wait
        self.home_wait_s = home_wait_s  # 0: a request with a full home spills at once
        self.serving_key = serving_key  # the master key (kama.serving_key); None: no key
        self.models: dict[str, Model] = {}
        self.alias_owners: dict[str, str] = {}  # alias -> key of the model it routes to
        self._pods: dict[str, tuple[str, dict[str, Any]]] = {}  # ns/pod -> (model key, pod)
        # (namespace, pod, in flight) for the pod's drain workflow (gateway.drain_reports)
        self.drain_notices: deque[tuple[str, str, int]] = deque()
        self.drain_noticed = asyncio.Event()
        # a request arrived (in flight, waiting for a slot or held at zero): demand may
        # have risen, worth sampling now rather than at the next interval
        self.demand_rose = asyncio.Event()

    # name resolution ------------------------------------------------------------

    def resolve(self, name: str) -> Model | None:
        """`<namespace>/<name>`, or an alias, which routes to the oldest model that
        claims it (`gateway.aliases`)."""
        model = self.models.get(name)
        if model is None and (owner := self.alias_owners.get(name)) is not None:
            model = self.models.get(owner)
        return model

    def owned_aliases(self, model: Model) -> tuple[list[str], dict[str, str]]:
        """The aliases `model` claims and owns, and those it claims that another
        (older) model owns, with their owner."""
        owned = [a for a in model.aliases if self.alias_owners.get(a) == model.key]
        lost = {a: self.alias_owners[a] for a in model.aliases if a not in owned}
        return owned, lost

    # watch events (on the event loop) -------------------------------------------

    def apply_deployment(self, event: str, obj: dict[str, Any]) -> None:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        key = f"{meta['namespace']}/{meta['name']}"
        if event == "DELETED" or meta.get("deletionTimestamp"):
            model = self.models.pop(key, None)
            if model is not None:
                self._retire(model)
                self.alias_owners = alias_owners(self.models.values())
            return
        scaling = spec.get("scaling") or {}
        model = self.models.get(key)
        if model is None or model.uid != meta["uid"]:
            if model is not None:
                self._retire(model)  # deleted and created again under the same name
            model = Model(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
            self.models[key] = model
            for pod_key, (owner, pod) in list(self._pods.items()):
                if owner == key:
                    self._place_pod(pod_key, owner, pod)
        model.aliases = tuple(spec.get("aliases") or ())
        model.created = int(_created(meta))
        self.alias_owners = alias_owners(self.models.values())
        model.max_queued = int(scaling.get("maxQueuedRequests", DEFAULT_MAX_QUEUED))
        model.cold_start_s = parse_duration(scaling.get("coldStartTimeout", "10m")).total_seconds()
        model.report_period_s = report_period(
            idle_timeout=parse_duration(scaling.get("idleTimeout", "10m")),
            scale_down_window=parse_duration(
                scaling.get("scaleDownWindow", DEFAULT_SCALE_DOWN_WINDOW)
            ),
        ).total_seconds()
        routing = spec.get("routing") or {}
        model.prefix_affinity = routing.get("strategy") == "PrefixAffinity"
        model.remote_media = routing.get("allowRemoteMediaUrls") is True
        runtime = spec.get("runtime") or {}
        model.mode = serving_mode(runtime.get("mode"))
        context = runtime.get("contextSize")
        model.context = context if isinstance(context, int) and context > 0 else None
        model.adapters = adapters_of(spec)
        model.reason = not_serving_reason(obj)
        model.cannot_start = cannot_start(obj)
        self._update_ready(model)  # held requests learn if it cannot start

    def apply_pod(self, event: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        deployment = (meta.get("labels") or {}).get(DEPLOYMENT_LABEL)
        if not deployment:
            return
        pod_key = f"{meta['namespace']}/{meta['name']}"
        owner = f"{meta['namespace']}/{deployment}"
        if event == "DELETED":
            self._pods.pop(pod_key, None)
            self.metrics.forget_pod(owner, meta["name"])
            model = self.models.get(owner)
            if model is not None:
                model.endpoints.pop(meta["name"], None)
                model.starting.pop(meta["name"], None)
                self._update_ready(model)
            return
        self._pods[pod_key] = (owner, pod)
        self._place_pod(pod_key, owner, pod)

    def _place_pod(self, pod_key: str, owner: str, pod: dict[str, Any]) -> None:
        model = self.models.get(owner)
        if model is None:
            return
        name = pod["metadata"]["name"]
        state = _pod_state(pod)
        current = model.endpoints.get(name)
        if state == "routable":
            model.starting.pop(name, None)
            ip = pod["status"]["podIP"]
            if current is None or current.ip != ip:
                model.endpoints[name] = self._endpoint(pod, ip=ip)
            else:
                current.early = False
        elif state == "starting" and current is not None and current.early:
            pass  # its supervisor already said ready; the kubelet will catch up
        elif state == "starting":
            model.endpoints.pop(name, None)
            model.starting[name] = self._endpoint(pod, ip=pod["status"]["podIP"])
        else:
            gone = model.endpoints.pop(name, None)
            model.starting.pop(name, None)
            if gone is not None and gone.in_flight and not gone.leaving:
                gone.leaving = True  # its drain waits for what this gateway still has there
                self.notify_drain(model, gone)
        self._update_ready(model)

    def _endpoint(self, pod: dict[str, Any], *, ip: str) -> Endpoint:
        """A new endpoint for `pod` at `ip`, with its llama-server's key if Kama has a
        master key (none for a pod without a controlling ModelDeployment)."""
        authorization = None
        if self.serving_key is not None:
            key = pod_serving_key(master=self.serving_key, pod=pod)
            if key is not None:
                authorization = bearer(key).encode("latin-1")
        return Endpoint(
            pod=pod["metadata"]["name"], ip=ip, slots=_slots(pod), authorization=authorization
        )

    def notify_drain(self, model: Model, endpoint: Endpoint) -> None:
        """Tell the drain of `endpoint`'s pod how many requests this gateway still has
        there (when it starts leaving, and again at zero)."""
        self.drain_notices.append((model.namespace, endpoint.pod, endpoint.in_flight))
        self.drain_noticed.set()

    def confirm_early(self, model: Model, pod: str) -> None:
        """A starting pod's supervisor reported ready: route to it now (a model at
        zero should not wait a kubelet probe period more than it must)."""
        endpoint = model.starting.pop(pod, None)
        if endpoint is not None and model is self.models.get(model.key):
            endpoint.early = True
            model.endpoints[pod] = endpoint
            self._update_ready(model)

    def _update_ready(self, model: Model) -> None:
        """`ready` is set while held requests have their answer: a replica to go to,
        or a reason the model cannot start."""
        if model.endpoints or model.cannot_start:
            model.ready.set()
        else:
            model.ready.clear()
        if model.slot_waiters:
            self.grant_slots(model)  # a replica came (more room) or went (fewer to try)

    def _retire(self, model: Model) -> None:
        """The model is gone: whoever waits for it is released and finds it gone."""
        model.endpoints.clear()
        model.ready.set()
        self.grant_slots(model)

    # requests ------------------------------------------------------------------

    def acquire(
        self,
        model: Model,
        *,
        route: str,
        exclude: Collection[str],
        now: float,
        affinity: Affinity | None = None,
        wait_for_home: bool = True,
    ) -> Lease | None:
        """The replica for the next request (see `gateway.routing`), counted in flight
        until the returned lease is released; None if no replica with a free slot is
        left to try, or if the request's home is full and worth waiting for
        (`wait_for_home`, and a `home_wait_s`): then `wait_for_slot`."""
        endpoint = choose_endpoint(
            model.endpoints.values(),
            exclude=exclude,
            now=now,
            affinity=affinity,
            remembered=model.served_prefixes.where(affinity) if affinity else None,
            wait_for_home=wait_for_home and self.home_wait_s > 0,
        )
        if endpoint is None:
            return None
        return self._lease(model, endpoint, route=route, affinity=affinity)

    def _home_worth_waiting_for(
        self, model: Model, *, exclude: Collection[str], now: float, affinity: Affinity | None
    ) -> Endpoint | None:
        """The request's home (`gateway.routing`), when a home wait is configured and
        the home served its conversation or shared prefix last (`ServedPrefixes`):
        a prefix not cached there gains nothing from waiting."""
        if affinity is None or self.home_wait_s <= 0:
            return None
        remembered = model.served_prefixes.where(affinity)
        home = home_endpoint(
            model.endpoints.values(),
            exclude=exclude,
            now=now,
            affinity=affinity,
            remembered=remembered,
        )
        return home if home is not None and home.pod == remembered else None

    def _lease(
        self, model: Model, endpoint: Endpoint, *, route: str, affinity: Affinity | None
    ) -> Lease:
        if affinity is not None:
            model.served_prefixes.record(affinity, endpoint.pod)
        series = self.metrics.series(model=model.key, route=route, pod=endpoint.pod)
        endpoint.in_flight += 1
        endpoint.served += 1
        model.in_flight += 1
        model.requests_since_report += 1
        self.demand_rose.set()
        series.begin()
        return Lease(model=model, endpoint=endpoint, series=series, registry=self)

    def can_wait(self, model: Model, *, exclude: Collection[str]) -> bool:
        """Whether a request that found no free slot may wait for one: some replica it
        has not tried is routable (all full, or others wait already)."""
        return any(pod not in exclude for pod in model.endpoints)

    async def wait_for_slot(
        self,
        model: Model,
        *,
        route: str,
        exclude: Collection[str],
        affinity: Affinity | None = None,
    ) -> Lease | None:
        """A lease on the first replica (not in `exclude`) with a free slot, in the
        order the module's docstring gives; None once no such replica is left to try.
        With `affinity`, up to `home_wait_s` for a slot on its home (chosen now, among
        every replica it may use, full or not) if the home served its prefix last,
        then on any."""
        if not self.can_wait(model, exclude=exclude):
            return None
        home = self._home_worth_waiting_for(
            model, exclude=exclude, now=time.monotonic(), affinity=affinity
        )
        granted: asyncio.Future[Lease | None] = asyncio.get_running_loop().create_future()
        waiter = SlotWaiter(route, exclude, granted, affinity=affinity, home=home)
        if home is not None:
            home.homed += 1
        model.slot_waiters.append(waiter)
        self.demand_rose.set()
        self.grant_slots(model)  # waiters that left are skipped; a free slot is granted now
        try:
            if waiter.home is not None and not granted.done():
                await wait_for_future(granted, within=self.home_wait_s, clock=self.clock)
                if not granted.done():  # its home wait is over: any replica now
                    _end_home_wait(waiter)
                    self.grant_slots(model)
            return await granted
        except asyncio.CancelledError:  # the waiter stays queued, done: granting skips it
            granted.cancel()  # if the cancel came during its home wait, not on `granted`
            lease = granted.result() if granted.done() and not granted.cancelled() else None
            if lease is not None:
                lease.release()  # granted as its client left: pass it on
            raise
        finally:
            _end_home_wait(waiter)

    def grant_slots(self, model: Model) -> None:
        """Hand free slots to waiting requests, longest waiting first, each a slot it
        may take (its home's only, during its home wait); a request with no replica
        left to try gets None."""
        waiters, now = model.slot_waiters, time.monotonic()
        free = self._has_free_slot(model)
        for waiter in waiters:
            if waiter.granted.done():  # cancelled (its client left) or granted
                continue
            lease = self._grant(model, waiter, now=now) if free else None
            if lease is None and self.can_wait(model, exclude=waiter.exclude):
                continue  # what it may use is full: a release or its home wait's end comes back
            _end_home_wait(waiter)
            waiter.granted.set_result(lease)
            free = free and self._has_free_slot(model)
        if any(waiter.granted.done() for waiter in waiters):
            waiting = [waiter for waiter in waiters if not waiter.granted.done()]
            waiters.clear()
            waiters.extend(waiting)

    def _grant(self, model: Model, waiter: SlotWaiter, *, now: float) -> Lease | None:
        """A lease for `waiter` if a slot it may take is free."""
        home = waiter.home
        if home is not None:
            if model.endpoints.get(home.pod) is home:
                free = home.in_flight < home.slots
                if not free:
                    return None
                return self._lease(model, home, route=waiter.route, affinity=waiter.affinity)
            _end_home_wait(waiter)  # its home left routing: any replica, at once
        return self.acquire(
            model,
            route=waiter.route,
            exclude=waiter.exclude,
            now=now,
            affinity=waiter.affinity,
            wait_for_home=False,
        )

    @staticmethod
    def _has_free_slot(model: Model) -> bool:
        return any(e.in_flight < e.slots for e in model.endpoints.values())

    def drop_endpoint(self, model: Model, endpoint: Endpoint) -> None:
        """A connection to it failed: stop routing there until the watch says otherwise."""
        model.endpoints.pop(endpoint.pod, None)
        self._update_ready(model)


def _end_home_wait(waiter: SlotWaiter) -> None:
    """The waiter no longer waits for its home (granted, gone, or its wait is over)."""
    if waiter.home is not None:
        waiter.home.homed -= 1
        waiter.home = None


def _created(meta: dict[str, Any]) -> float:
    stamp = meta.get("creationTimestamp")
    if not stamp:
        return 0.0
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
