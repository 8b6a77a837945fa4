"""The list+watch loop, in a thread (the official client's watch is synchronous).

List, remember the resourceVersion, watch with a server timeout, resume from the last
version seen (bookmarks included), re-list on 410 Gone, back off on other errors.
Every object goes to `on_object(event_type, object_dict)`; a re-list replays all of
them, which is harmless because consumers only nudge idempotent workflows.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

log = logging.getLogger("kama.watcher")

WATCH_TIMEOUT_S = 60
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0

OnObject = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class WatchTarget:
    """One collection to watch: a list function of the kubernetes client and its kwargs."""

    name: str
    list_fn: Callable[..., Any]
    kwargs: dict[str, Any]


class Gone(Exception):
    """The resourceVersion is too old: re-list."""


def run_watch(*, target: WatchTarget, on_object: OnObject, stop: threading.Event) -> None:
    backoff = BACKOFF_START_S
    while not stop.is_set():
        try:
            listing = target.list_fn(**target.kwargs)
            version = listing["metadata"]["resourceVersion"]
            for item in listing.get("items", []):
                on_object("SYNC", item)
            backoff = BACKOFF_START_S
            while not stop.is_set():
                version = _watch_once(
                    target=target, version=version, on_object=on_object, stop=stop
                )
        except Gone:
            log.info("%s: resourceVersion expired, re-listing", target.name)
        except (k8s.ApiException, OSError, ValueError) as exc:
            if isinstance(exc, k8s.ApiException) and exc.status == 404:
                log.info("%s: not served yet (CRD missing?), retrying", target.name)
            else:
                log.warning("%s: watch failed (%s), retrying in %.1fs", target.name, exc, backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)


def _watch_once(
    *, target: WatchTarget, version: str, on_object: OnObject, stop: threading.Event
) -> str:
    stream = k8s_watch.Watch().stream(
        target.list_fn,
        resource_version=version,
        timeout_seconds=WATCH_TIMEOUT_S,
        allow_watch_bookmarks=True,
        **target.kwargs,
    )
    for event in stream:
        if stop.is_set():
            break
        kind = event["type"]
        raw = event.get("raw_object") or event["object"]
        if kind == "ERROR":
            if raw.get("code") == 410:
                raise Gone()
            raise k8s.ApiException(status=raw.get("code", 500), reason=raw.get("message"))
        version = raw.get("metadata", {}).get("resourceVersion", version)
        if kind != "BOOKMARK":
            on_object(kind, raw)
    time.sleep(0)  # the server closed the watch after its timeout: resume from `version`
    return version


def as_dicts(api: k8s.ApiClient, list_fn: Callable[..., Any]) -> Callable[..., Any]:
    """A typed list call that returns plain dicts (watch calls pass through raw)."""

    @functools.wraps(list_fn)
    def call(**kwargs: Any) -> Any:
        result = list_fn(**kwargs)
        return result if kwargs.get("watch") else api.sanitize_for_serialization(result)

    return call
