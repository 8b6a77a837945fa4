"""The list+watch loop both the watcher and the gateway run, in a thread each (the
official client's watch is synchronous), with the guarantees an informer gives.

List, remember the resourceVersion, watch with a server timeout (and a client read
timeout, so a silently dead connection is noticed), resume from the last version
seen (bookmarks included), re-list on 410 Gone. *Any* other error — an API error,
a reset or half-closed connection (urllib3's `ProtocolError`), a refused connect
while the API server restarts — backs off (capped, with jitter) and re-lists.
Every object goes to `on_object(event_type, object_dict)`; a re-list replays them
all as `SYNC` and reports every object that vanished while the watch was down as
`DELETED`, so consumers that keep state (the gateway's registry) converge.

A loop that ends by anything but `stop` is a bug; the thread then takes its process
down (`os._exit` with a non-zero code) so Kubernetes restarts it, instead of leaving
a deaf process running. `WatchHealth` says whether every collection is synced and
connected (readiness) and whether every loop is alive (liveness)."""

from __future__ import annotations

import functools
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

log = logging.getLogger("kama.watch")

WATCH_TIMEOUT_S = 60
# the server ends a watch after WATCH_TIMEOUT_S; a connection silent for longer is dead
READ_TIMEOUT_S = WATCH_TIMEOUT_S + 15
CONNECT_TIMEOUT_S = 5
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
# readiness tolerates a short blip (a watch reconnecting) but not an outage
UNREADY_AFTER_FAILING_S = 10.0
WATCH_DIED_EXIT_CODE = 70

OnObject = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class WatchTarget:
    """One collection to watch: a list function of the kubernetes client and its kwargs."""

    name: str  # what is watched (a plural, "pods"), what handlers are chosen by
    list_fn: Callable[..., Any]
    kwargs: dict[str, Any]

    @property
    def label(self) -> str:
        """The name, with the namespace when one is watched (unique per watch loop)."""
        namespace = self.kwargs.get("namespace")
        return f"{self.name}@{namespace}" if namespace else self.name


class Gone(Exception):
    """The resourceVersion is too old: re-list."""


class ConsumerFailed(Exception):
    """`on_object` raised: a bug in this process, not a watch failure to retry."""


@dataclass
class CollectionHealth:
    synced: bool = False  # listed at least once
    failing_since: float | None = None  # monotonic time of the first failure in a row
    last_error: str | None = None
    alive: bool = True
    restarts: dict[str, int] = field(default_factory=dict)  # re-lists by reason (metrics)

    def connected(self) -> bool:
        """Listed, watching, and not failing right now."""
        return self.alive and self.synced and self.failing_since is None

    def restarted(self, *, reason: str) -> None:
        self.restarts[reason] = self.restarts.get(reason, 0) + 1


@dataclass
class WatchHealth:
    """What the processes' health endpoints report about their watches."""

    collections: dict[str, CollectionHealth] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def track(self, name: str) -> CollectionHealth:
        with self.lock:
            return self.collections.setdefault(name, CollectionHealth())

    def ready(self, *, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        with self.lock:
            return bool(self.collections) and all(
                c.alive
                and c.synced
                and (c.failing_since is None or now - c.failing_since < UNREADY_AFTER_FAILING_S)
                for c in self.collections.values()
            )

    def listed(self) -> bool:
        """Every watch has listed once and its loop is alive, failing right now or not:
        what a process that serves from its last listing (the gateway) needs to be
        ready, so that an API-server blip is not a data-plane outage."""
        with self.lock:
            return bool(self.collections) and all(
                c.alive and c.synced for c in self.collections.values()
            )

    def alive(self) -> bool:
        with self.lock:
            return all(c.alive for c in self.collections.values())

    def snapshot(self) -> dict[str, CollectionHealth]:
        """A copy of every collection's health (for metrics, read at scrape time)."""
        with self.lock:
            return {
                name: replace(c, restarts=dict(c.restarts)) for name, c in self.collections.items()
            }

    def report(self) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        with self.lock:
            return {
                name: {
                    "synced": c.synced,
                    "alive": c.alive,
                    "failingForSeconds": None
                    if c.failing_since is None
                    else round(now - c.failing_since, 1),
                    "lastError": c.last_error,
                }
                for name, c in self.collections.items()
            }


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata", {})
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


class _Loop:
    """The state of one collection's loop: last version and the objects it knows."""

    def __init__(
        self,
        *,
        target: WatchTarget,
        on_object: OnObject,
        stop: threading.Event,
        health: CollectionHealth,
    ) -> None:
        self.target = target
        self.on_object = on_object
        self.stop = stop
        self.health = health
        self.known: dict[str, dict[str, Any]] = {}

    def run(self) -> None:
        backoff = BACKOFF_START_S
        while not self.stop.is_set():
            try:
                version = self._list()
                backoff = BACKOFF_START_S
                while not self.stop.is_set():
                    version = self._watch_once(version=version)
            except Gone:
                self.health.restarted(reason="gone")
                log.info("%s: resourceVersion expired, re-listing", self.target.label)
            except ConsumerFailed:
                raise
            except Exception as exc:  # any failure: back off, then list again
                self._failed(exc=exc, backoff=backoff)
                self.stop.wait(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _failed(self, *, exc: Exception, backoff: float) -> None:
        self.health.restarted(reason="error")
        if self.health.failing_since is None:
            self.health.failing_since = time.monotonic()
        self.health.last_error = f"{type(exc).__name__}: {exc}"[:300]
        if isinstance(exc, k8s.ApiException) and exc.status == 404:
            log.info("%s: not served yet (CRD missing?), retrying", self.target.label)
        else:
            log.warning(
                "%s: watch failed (%s), re-listing in %.1fs",
                self.target.label,
                self.health.last_error,
                backoff,
            )

    def _deliver(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            self.on_object(kind, obj)
        except Exception as exc:
            raise ConsumerFailed(f"{self.target.label}: handling {kind} failed") from exc

    def _ok(self) -> None:
        if self.health.failing_since is not None:
            log.info("%s: watching again", self.target.label)
        self.health.failing_since = None
        self.health.last_error = None

    def _list(self) -> str:
        listing = self.target.list_fn(
            **self.target.kwargs, _request_timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
        )
        items: list[dict[str, Any]] = listing.get("items", [])
        current = {_key(item): item for item in items}
        for key, gone in list(self.known.items()):
            if key not in current:  # deleted while the watch was down
                self._deliver("DELETED", gone)
        self.known = current
        for item in items:
            self._deliver("SYNC", item)
        self.health.synced = True
        self._ok()
        return str(listing["metadata"]["resourceVersion"])

    def _watch_once(self, *, version: str) -> str:
        stream = k8s_watch.Watch().stream(
            self.target.list_fn,
            resource_version=version,
            timeout_seconds=WATCH_TIMEOUT_S,
            allow_watch_bookmarks=True,
            _request_timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S),
            **self.target.kwargs,
        )
        for event in stream:
            if self.stop.is_set():
                break
            kind = event["type"]
            raw = event.get("raw_object") or event["object"]
            if kind == "ERROR":
                if raw.get("code") == 410:
                    raise Gone()
                raise k8s.ApiException(status=raw.get("code", 500), reason=raw.get("message"))
            version = raw.get("metadata", {}).get("resourceVersion", version)
            self._ok()
            if kind == "BOOKMARK":
                continue
            if kind == "DELETED":
                self.known.pop(_key(raw), None)
            else:
                self.known[_key(raw)] = raw
            self._deliver(kind, raw)
        # the server closed the watch after its timeout: resume from `version`
        return version


def run_watch(
    *, target: WatchTarget, on_object: OnObject, stop: threading.Event, health: WatchHealth
) -> None:
    """Watch `target` until `stop`; never returns early on an error."""
    _Loop(target=target, on_object=on_object, stop=stop, health=health.track(target.label)).run()


def _exit_now(code: int) -> None:
    logging.shutdown()  # flush the reason first
    os._exit(code)


def start_watch(
    *,
    target: WatchTarget,
    on_object: OnObject,
    stop: threading.Event,
    health: WatchHealth,
    exit_process: Callable[[int], None] | None = None,
) -> threading.Thread:
    """Run the watch in a daemon thread; if the loop ever ends other than by `stop`,
    mark it dead and take the process down."""
    tracked = health.track(target.label)
    exit_process = exit_process or _exit_now

    def guarded() -> None:
        try:
            run_watch(target=target, on_object=on_object, stop=stop, health=health)
        except BaseException:
            log.exception("%s: watch loop died; exiting so the process restarts", target.label)
            tracked.alive = False
            exit_process(WATCH_DIED_EXIT_CODE)
            return
        if not stop.is_set():  # run_watch only returns on stop; anything else is a bug
            tracked.alive = False
            exit_process(WATCH_DIED_EXIT_CODE)

    thread = threading.Thread(target=guarded, name=f"watch-{target.label}", daemon=True)
    thread.start()
    return thread


def kama_objects(
    *, custom: k8s.CustomObjectsApi, group: str, version: str, plural: str, namespace: str | None
) -> WatchTarget:
    """One of Kama's resources, in one namespace or in all (`namespace` None)."""
    kwargs: dict[str, Any] = {"group": group, "version": version, "plural": plural}
    if namespace is None:
        return WatchTarget(name=plural, list_fn=custom.list_cluster_custom_object, kwargs=kwargs)
    kwargs["namespace"] = namespace
    return WatchTarget(name=plural, list_fn=custom.list_namespaced_custom_object, kwargs=kwargs)


def labelled_pods(*, api: k8s.ApiClient, selector: str, namespace: str | None) -> WatchTarget:
    """Pods with a label selector, in one namespace or in all (`namespace` None)."""
    core = k8s.CoreV1Api(api)
    if namespace is None:
        list_fn = as_dicts(api, core.list_pod_for_all_namespaces)
        return WatchTarget(name="pods", list_fn=list_fn, kwargs={"label_selector": selector})
    list_fn = as_dicts(api, core.list_namespaced_pod)
    kwargs = {"label_selector": selector, "namespace": namespace}
    return WatchTarget(name="pods", list_fn=list_fn, kwargs=kwargs)


def as_dicts(api: k8s.ApiClient, list_fn: Callable[..., Any]) -> Callable[..., Any]:
    """A typed list call that returns plain dicts (watch calls pass through raw)."""

    @functools.wraps(list_fn)
    def call(**kwargs: Any) -> Any:
        result = list_fn(**kwargs)
        return result if kwargs.get("watch") else api.sanitize_for_serialization(result)

    return call


def in_namespaces(
    make: Callable[[str | None], WatchTarget], *, namespaces: tuple[str, ...]
) -> list[WatchTarget]:
    """One watch per served namespace, or one over all namespaces (`namespaces` empty)."""
    if not namespaces:
        return [make(None)]
    return [make(namespace) for namespace in namespaces]
