"""Which serving-pod events a deployment's workflow acts on.

The kubelet and the workflow itself write a pod many times over its life, and most
writes change nothing the workflow reads (a probe's timestamp, the resourceVersion,
managed fields). A workflow looks at a pod's phase, address, node, readiness and
containers' states, labels and deletion; an event that changes none of those is not
signalled. What a pod looked like is kept per pod uid until its DELETED event, so
memory follows the pods that exist; after a watcher restart every pod counts as
changed once."""

from __future__ import annotations

from typing import Any

Digest = tuple[object, ...]


def pod_digest(pod: dict[str, Any]) -> Digest:
    """What of a pod its deployment's workflow acts on."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    conditions = tuple(
        sorted((str(c.get("type")), str(c.get("status"))) for c in status.get("conditions") or [])
    )
    containers = tuple(
        sorted(
            (
                str(c.get("name")),
                bool(c.get("ready")),
                bool(c.get("started")),
                int(c.get("restartCount") or 0),
                tuple(sorted((c.get("state") or {}).keys())),
                tuple(
                    sorted(
                        str(state.get("reason") or "")
                        for state in (c.get("state") or {}).values()
                        if isinstance(state, dict)
                    )
                ),
            )
            for c in [
                *(status.get("initContainerStatuses") or []),
                *(status.get("containerStatuses") or []),
            ]
        )
    )
    return (
        status.get("phase"),
        status.get("podIP"),
        spec.get("nodeName"),
        meta.get("deletionTimestamp") is not None,
        tuple(sorted((meta.get("labels") or {}).items())),
        conditions,
        containers,
    )


class PodChanges:
    """The last digest of each pod, to tell an event that changed something."""

    def __init__(self) -> None:
        self._seen: dict[str, Digest] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def changed(self, event_type: str, pod: dict[str, Any]) -> bool:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if event_type == "DELETED":
            self._seen.pop(uid, None)
            return True
        digest = pod_digest(pod)
        if self._seen.get(uid) == digest:
            return False
        self._seen[uid] = digest
        return True
