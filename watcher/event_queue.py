"""The watcher's queue of watch events: one pending entry per object, served in turn
by namespace.

The watcher handles events one at a time (each is a Temporal call). Queued as they
came, one tenant's churn (hundreds of pods restarting, a script patching its objects)
would stand in front of every other tenant's events, and the same object's events
would be handled again and again although only its latest state matters: a nudge
carries the latest snapshot, a pod signal carries nothing but "look again". So an
event replaces the one still pending for the same key (its latest state wins), and
the namespaces with pending events take turns: a namespace with a thousand pending
objects delays another namespace's next event by at most one handling.

Keys are the caller's: an entity's uid, a serving pod's controlling deployment (its
pods' events all ask the same workflow to look again). A retry (`retry`) never
replaces a newer pending event. Bounded by the objects that exist: one entry each."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Any

Event = tuple[str, str, dict[str, Any]]  # (watch name, event type, object)


class CoalescingQueue:
    def __init__(self) -> None:
        self._pending: dict[Hashable, Event] = {}
        self._keys: dict[str, deque[Hashable]] = {}  # per namespace, in arrival order
        self._turns: deque[str] = deque()  # namespaces with pending events
        self._ready = asyncio.Event()
        self.coalesced = 0  # events replaced by a later one before they were handled

    def __len__(self) -> int:
        return len(self._pending)

    def put(self, key: Hashable, *, namespace: str, event: Event) -> None:
        """Queue `event`, replacing the one pending for `key`."""
        if key in self._pending:
            self._pending[key] = event
            self.coalesced += 1
            return
        self._pending[key] = event
        keys = self._keys.get(namespace)
        if keys is None:
            keys = self._keys[namespace] = deque()
            self._turns.append(namespace)
        keys.append(key)
        self._ready.set()

    def retry(self, key: Hashable, *, namespace: str, event: Event) -> None:
        """Queue `event` again after it failed, unless a newer one is pending."""
        if key not in self._pending:
            self.put(key, namespace=namespace, event=event)

    async def get(self) -> Event:
        """The next event: the oldest pending one of the namespace whose turn it is."""
        while not self._pending:
            self._ready.clear()
            await self._ready.wait()
        namespace = self._turns.popleft()
        keys = self._keys[namespace]
        key = keys.popleft()
        if keys:
            self._turns.append(namespace)
        else:
            del self._keys[namespace]
        return self._pending.pop(key)
