"""Kubernetes Events from the process node, as the kubelet records them."""

from __future__ import annotations

import datetime
import logging
import threading
import uuid
from typing import Any

from kubernetes import client as k8s

log = logging.getLogger("processnode.events")


class EventRecorder:
    def __init__(self, *, core: k8s.CoreV1Api, node_name: str) -> None:
        self.core = core
        self.node_name = node_name
        self._seen: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def normal(self, pod: Any, reason: str, message: str) -> None:
        self._emit(pod, "Normal", reason, message)

    def warn(self, pod: Any, reason: str, message: str) -> None:
        self._emit(pod, "Warning", reason, message)

    def warn_once(self, pod: Any, reason: str, message: str) -> None:
        key = (pod.metadata.uid, reason, message)
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        self._emit(pod, "Warning", reason, message)

    def _emit(self, pod: Any, kind: str, reason: str, message: str) -> None:
        now = datetime.datetime.now(datetime.UTC)
        event = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(
                name=f"{pod.metadata.name}.{uuid.uuid4().hex[:12]}",
                namespace=pod.metadata.namespace,
            ),
            involved_object=k8s.V1ObjectReference(
                kind="Pod",
                name=pod.metadata.name,
                namespace=pod.metadata.namespace,
                uid=pod.metadata.uid,
                api_version="v1",
            ),
            reason=reason,
            message=message[:1024],
            type=kind,
            source=k8s.V1EventSource(component="kubelet", host=self.node_name),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            self.core.create_namespaced_event(pod.metadata.namespace, event)
        except k8s.ApiException as exc:
            log.debug("event %s for %s not recorded: %s", reason, pod.metadata.name, exc.reason)
