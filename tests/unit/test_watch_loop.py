"""The list+watch loop survives what an API server restart looks like to a client
(urllib3's `ProtocolError: Response ended prematurely`, a refused connection), re-lists,
reports objects deleted meanwhile, and a loop that dies anyway exits its process.
The stack test `tests/integration/test_control_plane_outages.py` restarts a real API server."""

from __future__ import annotations

import threading
from typing import Any

from urllib3.exceptions import ProtocolError

from informer.watch import WATCH_DIED_EXIT_CODE, WatchHealth, WatchTarget, run_watch, start_watch


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"}}


class FlakyCollection:
    """A list function whose listings change and whose every watch breaks the way a
    killed API server breaks it; stops the loop after `lists` listings."""

    def __init__(self, *, listings: list[list[dict[str, Any]]], stop: threading.Event) -> None:
        self.listings = listings
        self.stop = stop
        self.calls: list[str] = []

    def __call__(self, **kwargs: Any) -> dict[str, Any]:
        if kwargs.get("watch"):
            self.calls.append("watch")
            raise ProtocolError("Response ended prematurely")
        self.calls.append("list")
        if len(self.calls) == 3:  # the API server is still down on the first re-list
            raise ConnectionRefusedError(111, "Connection refused")
        items = self.listings.pop(0)
        if not self.listings:
            self.stop.set()
        return {"metadata": {"resourceVersion": str(len(self.calls))}, "items": items}


def test_a_broken_watch_relists_and_reports_what_vanished(monkeypatch: Any) -> None:
    monkeypatch.setattr("informer.watch.BACKOFF_START_S", 0.001)
    stop = threading.Event()
    collection = FlakyCollection(listings=[[_pod("a"), _pod("b")], [_pod("b")]], stop=stop)
    events: list[tuple[str, str]] = []
    health = WatchHealth()

    run_watch(
        target=WatchTarget(name="pods", list_fn=collection, kwargs={}),
        on_object=lambda kind, obj: events.append((kind, obj["metadata"]["name"])),
        stop=stop,
        health=health,
    )

    assert collection.calls == ["list", "watch", "list", "list"]
    assert events == [("SYNC", "a"), ("SYNC", "b"), ("DELETED", "a"), ("SYNC", "b")]
    assert health.ready()  # the last listing succeeded


def test_health_is_unready_while_the_api_server_stays_away(monkeypatch: Any) -> None:
    health = WatchHealth()
    tracked = health.track("pods")
    tracked.synced = True
    assert health.ready(now=100.0)
    tracked.failing_since = 100.0
    assert health.ready(now=105.0)  # a reconnect blip
    assert not health.ready(now=111.0)
    assert health.alive()


def test_a_loop_that_dies_takes_the_process_down() -> None:
    stop = threading.Event()
    exits: list[int] = []

    def on_object(kind: str, obj: dict[str, Any]) -> None:
        raise RuntimeError("a bug in the consumer")

    health = WatchHealth()
    thread = start_watch(
        target=WatchTarget(
            name="pods",
            list_fn=lambda **_: {"metadata": {"resourceVersion": "1"}, "items": [_pod("a")]},
            kwargs={},
        ),
        on_object=on_object,
        stop=stop,
        health=health,
        exit_process=exits.append,
    )
    thread.join(timeout=10)
    assert exits == [WATCH_DIED_EXIT_CODE]
    assert not health.alive() and not health.ready()
