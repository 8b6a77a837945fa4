"""A Kubernetes Event about one of Kama's objects, as the API takes it (core/v1).

The worker records Events about the objects its workflows act on, and the gateway
records one when a ModelAccessKey's hash is held twice; both write this shape, so
`kubectl describe` shows them alike. Pure: the caller supplies the time and a unique
suffix for the Event's name."""

from __future__ import annotations

import datetime
from typing import Any, Final

from kama.api.meta import API_VERSION

EVENT_MESSAGE_LIMIT: Final = 1024  # characters of an Event's message
REPORTING_COMPONENT: Final = "kama.dev/controller"


def event_manifest(
    *,
    kind: str,
    namespace: str,
    name: str,
    uid: str,
    type: str,  # Normal | Warning
    reason: str,
    message: str,
    now: datetime.datetime,
    suffix: str,
    instance: str,
) -> dict[str, Any]:
    """The Event `reason` (`type`) about `kind` `namespace`/`name`, reported by
    `instance` (e.g. `kama-worker`, `kama-gateway`)."""
    stamp = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{suffix}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": kind,
            "name": name,
            "namespace": namespace,
            "uid": uid,
        },
        "reason": reason,
        "message": message[:EVENT_MESSAGE_LIMIT],
        "type": type,
        "source": {"component": "kama"},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": REPORTING_COMPONENT,
        "reportingInstance": instance,
    }
