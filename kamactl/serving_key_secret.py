"""The serving master key (`kama.serving_key`) kept in one Secret the worker creates,
never one the chart renders.

A chart that generates the key renders a new one on every `helm template` (Argo CD,
Flux and every other GitOps tool render that way: Helm's `lookup` is empty there), so
every sync replaced the Secret and the running replicas, created with the old key,
answered the gateway 401. So the chart only names the Secret (`KAMA_SERVING_KEY_SECRET`,
`<namespace>/<name>`) and the worker, at start, reads it or, when it does not exist
and it may (`KAMA_SERVING_KEY_GENERATE`, off for an operator's own Secret), creates it
with a random key. Two workers starting at once both try; the API server lets one
create and the other reads what it created. The Secret has no owner, so it outlives
uninstalls; the gateway reads it through its pod's env (`secretKeyRef`): a gateway that
starts before the first worker waits for the Secret. The read is bounded: a key longer
than `MAX_KEY_BYTES` is refused, not used."""

from __future__ import annotations

import base64
import binascii
import logging
import secrets
from typing import Final

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

GENERATED_KEY_BYTES: Final = 36  # 48 characters of URL-safe base64
MAX_KEY_BYTES: Final = 4096
GENERATED_BY: Final = "kama.dev/generated-by"


class ServingKeyUnavailable(RuntimeError):
    """The Secret cannot give a usable key: the worker does not start with none."""


def parse_secret_ref(ref: str) -> tuple[str, str]:
    """`<namespace>/<name>` as (namespace, name)."""
    namespace, _, name = ref.partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError(f"KAMA_SERVING_KEY_SECRET {ref!r} is not <namespace>/<name>")
    return namespace, name


def _key_of(secret: k8s.V1Secret, *, field: str, where: str) -> str:
    encoded = (secret.data or {}).get(field)
    if not encoded:
        raise ServingKeyUnavailable(f"Secret {where} has no key {field!r}")
    if len(encoded) > 2 * MAX_KEY_BYTES:  # before decoding what the API server sent
        raise ServingKeyUnavailable(f"Secret {where}'s {field!r} is over {MAX_KEY_BYTES} bytes")
    try:
        raw = base64.b64decode(encoded, validate=True)
        key = raw.decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        raise ServingKeyUnavailable(f"Secret {where}'s {field!r} is not UTF-8 text") from None
    if len(raw) > MAX_KEY_BYTES:
        raise ServingKeyUnavailable(f"Secret {where}'s {field!r} is over {MAX_KEY_BYTES} bytes")
    if not key:
        raise ServingKeyUnavailable(f"Secret {where}'s {field!r} is empty")
    return key


def ensure_serving_key(
    core: k8s.CoreV1Api, *, namespace: str, name: str, field: str, generate: bool
) -> str:
    """The master key in Secret `namespace/name` under `field`; when the Secret does not
    exist and `generate`, one created now with a random key."""
    where = f"{namespace}/{name}"
    try:
        return _key_of(core.read_namespaced_secret(name, namespace), field=field, where=where)
    except ApiException as exc:
        if exc.status != 404:
            raise
    if not generate:
        raise ServingKeyUnavailable(
            f"Secret {where} does not exist (servingKey.existingSecret names it: create it "
            f"with the master key under {field!r})"
        )
    key = secrets.token_urlsafe(GENERATED_KEY_BYTES)
    body = k8s.V1Secret(
        metadata=k8s.V1ObjectMeta(
            name=name, namespace=namespace, annotations={GENERATED_BY: "kama-worker"}
        ),
        type="Opaque",
        data={field: base64.b64encode(key.encode()).decode()},
    )
    try:
        core.create_namespaced_secret(namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        # another worker created it first: use its key
        return _key_of(core.read_namespaced_secret(name, namespace), field=field, where=where)
    log.info("created the serving master key in Secret %s", where)
    return key
