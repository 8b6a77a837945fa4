"""The watcher's event queue and pod filter: one tenant's churn neither repeats work
nor stands in front of another tenant's events (`watcher.event_queue`,
`watcher.pod_changes`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from watcher.event_queue import CoalescingQueue
from watcher.main import event_key
from watcher.pod_changes import PodChanges

pytestmark = pytest.mark.timeout(30)


def obj(namespace: str, name: str, *, version: int = 1, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": f"u-{name}", **meta},
        "spec": {"version": version},
    }


async def drain(queue: CoalescingQueue) -> list[tuple[str, int]]:
    handled = []
    while len(queue):
        _, _, got = await queue.get()
        handled.append((got["metadata"]["name"], got["spec"]["version"]))
    return handled


async def test_an_objects_latest_event_replaces_the_pending_one() -> None:
    queue = CoalescingQueue()
    for version in range(1, 101):
        event = obj("noisy", "churn", version=version)
        queue.put(event_key("modeldeployments", event), namespace="noisy", event=("x", "M", event))
    assert await drain(queue) == [("churn", 100)], "one handling, of the latest state"
    assert queue.coalesced == 99


async def test_namespaces_take_turns() -> None:
    """A flood of 1,000 objects in one namespace delays another namespace's event by
    one handling, not by a thousand."""
    queue = CoalescingQueue()
    for n in range(1000):
        event = obj("noisy", f"o{n}")
        queue.put(("d", "noisy", f"o{n}"), namespace="noisy", event=("x", "M", event))
    quiet = obj("quiet", "mine")
    queue.put(("d", "quiet", "mine"), namespace="quiet", event=("x", "M", quiet))
    first = [(await queue.get())[2]["metadata"]["namespace"] for _ in range(2)]
    assert first == ["noisy", "quiet"]


async def test_a_retry_never_replaces_a_newer_event() -> None:
    queue = CoalescingQueue()
    old, new = obj("ns", "a", version=1), obj("ns", "a", version=2)
    queue.put(("d", "ns", "a"), namespace="ns", event=("x", "M", new))
    queue.retry(("d", "ns", "a"), namespace="ns", event=("x", "M", old))
    assert await drain(queue) == [("a", 2)]
    queue.retry(("d", "ns", "a"), namespace="ns", event=("x", "M", old))
    assert await drain(queue) == [("a", 1)], "with nothing newer, the retry is queued"


async def test_get_waits_for_an_event() -> None:
    queue = CoalescingQueue()
    waiting = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    queue.put("k", namespace="ns", event=("x", "ADDED", obj("ns", "a")))
    assert (await asyncio.wait_for(waiting, 5))[1] == "ADDED"


def serving_pod(*, restarts: int = 0, **status: Any) -> dict[str, Any]:
    owner = {"kind": "ModelDeployment", "name": "chat", "uid": "d-1", "controller": True}
    return {
        "metadata": {"namespace": "ns", "name": "chat-0", "uid": "p-1",
                     "ownerReferences": [owner], "resourceVersion": str(restarts)},
        "status": {"phase": "Running", "podIP": "10.0.0.1", **status,
                   "containerStatuses": [{"name": "runtime", "ready": True,
                                          "restartCount": restarts, "state": {"running": {}}}]},
    }  # fmt: skip


def test_pod_writes_that_change_nothing_a_workflow_reads_are_left_out() -> None:
    changes = PodChanges()
    assert changes.changed("ADDED", serving_pod())
    noise = serving_pod()
    noise["metadata"]["resourceVersion"] = "99"
    noise["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastProbeTime": "t"}]
    assert changes.changed("MODIFIED", noise), "conditions appeared"
    assert not changes.changed("MODIFIED", noise), "the same again: nothing to act on"
    noise["status"]["conditions"][0]["lastProbeTime"] = "later"
    assert not changes.changed("MODIFIED", noise), "a probe's timestamp: nothing to act on"
    assert changes.changed("MODIFIED", serving_pod(restarts=1)), "a container restarted"
    assert changes.changed("DELETED", serving_pod(restarts=1))
    assert len(changes) == 0, "a deleted pod is forgotten"


def test_a_deployments_pods_coalesce_into_one_signal() -> None:
    first, second = serving_pod(), serving_pod()
    second["metadata"] |= {"name": "chat-1", "uid": "p-2"}
    assert event_key("pods", first) == event_key("pods", second) == ("pods", "ns", "d-1")
    assert event_key("modeldeployments", obj("ns", "chat")) == ("modeldeployments", "ns", "u-chat")
