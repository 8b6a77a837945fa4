"""Warning Events on ModelAccessKeys, written by the gateway: the one thing it writes
to Kubernetes (RBAC: `events` `create`, nothing else).

A key whose hash another object holds too is refused (`gateway.auth`); the tenant
learns why from an Event on its own object, not from the gateway's log. Writes leave
the event loop for a thread, one at a time, and a failed write is logged and
dropped: an Event is a notice, and the refusal stands without it. At most
`MAX_PENDING` wait, so a flood of copies cannot queue unbounded writes."""

from __future__ import annotations

import asyncio
import datetime
import logging
import uuid
from collections import deque

from kubernetes import client as k8s

from gateway.auth import AccessKey
from kama.api import MODELACCESSKEY_KIND
from kama.kube_events import event_manifest

log = logging.getLogger("kama.gateway")

MAX_PENDING = 256
EVENT_TIMEOUT_S = 10.0


class KeyEventRecorder:
    """`AccessControl.warn`: records each warning as an Event on its key's object."""

    def __init__(self, *, api: k8s.ApiClient) -> None:
        self._core = k8s.CoreV1Api(api)
        self._pending: deque[dict[str, object]] = deque(maxlen=MAX_PENDING)
        self._writer: asyncio.Task[None] | None = None

    def __call__(self, key: AccessKey, reason: str, message: str) -> None:
        self._pending.append(
            event_manifest(
                kind=MODELACCESSKEY_KIND,
                namespace=key.namespace,
                name=key.name,
                uid=key.uid,
                type="Warning",
                reason=reason,
                message=message,
                now=datetime.datetime.now(datetime.UTC),
                suffix=uuid.uuid4().hex[:12],
                instance="kama-gateway",
            )
        )
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        while self._pending:
            event = self._pending.popleft()
            meta = event["metadata"]
            assert isinstance(meta, dict)
            try:
                await asyncio.to_thread(
                    self._core.create_namespaced_event,
                    meta["namespace"],
                    event,
                    _request_timeout=EVENT_TIMEOUT_S,
                )
            except Exception as exc:  # a notice: the refusal stands without it
                log.warning("recording Event %s failed: %s", meta["name"], exc)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
