"""The API key each ModelDeployment's llama-server requires, derived, never stored.

llama-server answers anyone who reaches its port: inference, and also `/slots`,
`/props` and `/metrics`, which say what other tenants' prompts cost and (with
`/slots`) can act on its slots. The NetworkPolicy keeps other pods away where the
cluster enforces it; this key is the second lock, for clusters that do not. Every
serving pod's llama-server is started with `--api-key` (from the `LLAMA_API_KEY`
environment variable, as llama.cpp's `common/arg.cpp` reads it) and answers 401
without it, on every route but `/health` (`tools/server/server-http.cpp`'s public
endpoints). Only Kama's worker and gateway send it, and the pod's own runtime, which
relays `/metrics` (counters, nothing a request said) to Prometheus on its port.

The key of one deployment is HMAC-SHA256 of a master key (`KAMA_SERVING_KEY`, held
only by the worker and the gateway, the chart's `<release>-serving-key` Secret)
over `<namespace>/<ModelDeployment uid>`. So nothing has to be stored or
distributed per deployment: the worker derives it when it creates a pod (into the
pod's env, which whoever may read pods in that namespace can read: it opens that
deployment's llama-server and no other), the gateway derives it from the pods it
watches, and a key read from one namespace's pod opens no other namespace's
model (the namespace is part of what is signed, so a pod that names another
deployment's uid in its own namespace still gets a key of its own namespace).

A pod keeps the key it was created with: a new master key applies to pods created
after it, so the running ones are deleted (Kama replaces them) when it changes. A
pod created without a key (no master key then) requires none, and the gateway's
header does no harm there. The pod's fingerprint does not include the key.

Never put a key into a workflow's input, output or history: it is computed in
activities and in the gateway only. Pure: no I/O."""

from __future__ import annotations

import copy
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any, Final

SERVING_KEY_ENV: Final = "KAMA_SERVING_KEY"  # the master key, worker and gateway only
LLAMA_API_KEY_ENV: Final = "LLAMA_API_KEY"  # llama-server's --api-key, from its env
RUNTIME_CONTAINER: Final = "runtime"  # kama.serving_pod's container that runs llama-server
DEPLOYMENT_KIND: Final = "ModelDeployment"


def serving_key(*, master: str, namespace: str, deployment_uid: str) -> str:
    """The llama-server API key of the ModelDeployment `deployment_uid` in
    `namespace` (64 hex digits)."""
    message = f"{namespace}/{deployment_uid}".encode()
    return hmac.new(master.encode(), message, hashlib.sha256).hexdigest()


def bearer(key: str) -> str:
    """The `Authorization` header value that carries `key` to llama-server."""
    return f"Bearer {key}"


def controller_uid(owner_references: list[Mapping[str, Any]] | None) -> str | None:
    """The uid of a pod's controlling ModelDeployment, from its ownerReferences as
    the API server sends them (None when it has none)."""
    for owner in owner_references or []:
        if owner.get("kind") == DEPLOYMENT_KIND and owner.get("controller") and owner.get("uid"):
            return str(owner["uid"])
    return None


def pod_serving_key(*, master: str, pod: Mapping[str, Any]) -> str | None:
    """The key a serving pod's llama-server requires, from the pod object (its
    namespace and controlling ModelDeployment's uid); None for a pod with neither."""
    meta = pod.get("metadata") or {}
    uid = controller_uid(meta.get("ownerReferences"))
    namespace = meta.get("namespace")
    if not uid or not namespace:
        return None
    return serving_key(master=master, namespace=str(namespace), deployment_uid=uid)


def with_serving_key(manifest: Mapping[str, Any], *, key: str) -> dict[str, Any]:
    """A copy of a serving pod's manifest whose runtime container has `key` as
    llama-server's API key. Labels are left alone: the pod's fingerprint is the
    template's, and the key does not change what a replica is."""
    pod: dict[str, Any] = copy.deepcopy(dict(manifest))
    for container in pod["spec"]["containers"]:
        if container["name"] == RUNTIME_CONTAINER:
            env = [e for e in container.get("env") or [] if e.get("name") != LLAMA_API_KEY_ENV]
            container["env"] = [*env, {"name": LLAMA_API_KEY_ENV, "value": key}]
            return pod
    raise ValueError(f"the manifest has no {RUNTIME_CONTAINER!r} container")
