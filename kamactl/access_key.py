"""`kama access-key create`: mint an API key for the gateway and the ModelAccessKey
that lets the gateway recognise it.

The key names its object, `kama_<namespace>_<name>_<secret>` (`kama.api.access_key`),
with a random secret (256 bits from `secrets`); it is printed once on stderr, and
never stored:
the object printed on stdout holds only its SHA-256, so

    kama access-key create my-app -n team-a | kubectl apply -f -

shows the key on the terminal and creates the object in one step, with the tenant's
own Kubernetes rights (the gateway needs none beyond reading ModelAccessKeys). Rotate
by creating a second key, moving clients to it, and deleting the first object."""

from __future__ import annotations

import re
import secrets
import sys
from typing import TextIO

import yaml

from kama.api import (
    ModelAccessKey,
    ModelAccessKeySpec,
    ObjectMeta,
    key_object,
    key_sha256,
    minted_key,
)
from kama.api.meta import DNS_SUBDOMAIN_PATTERN

SECRET_BYTES = 32


def mint_key(*, namespace: str, name: str) -> str:
    """A new key for ModelAccessKey `namespace`/`name`."""
    return minted_key(namespace=namespace, name=name, secret=secrets.token_urlsafe(SECRET_BYTES))


def check_names(*, name: str, namespace: str) -> None:
    for what, value in (("name", name), ("namespace", namespace)):
        if len(value) > 253 or not re.match(DNS_SUBDOMAIN_PATTERN, value):
            raise ValueError(f"{what} {value!r} is not a valid Kubernetes name")


def access_key_manifest(
    *,
    name: str,
    namespace: str,
    key: str,
    models: list[str],
    namespaces: list[str],
    requests_per_minute: int | None,
    tokens_per_minute: int | None,
    max_concurrent_requests: int | None = None,
) -> str:
    """The ModelAccessKey for `key` as YAML (validated as the CRD validates it)."""
    check_names(name=name, namespace=namespace)
    if key_object(key) != (namespace, name):
        raise ValueError(f"the key does not name ModelAccessKey {namespace}/{name}")
    spec = ModelAccessKeySpec(
        key_sha256=key_sha256(key),
        models=models,
        namespaces=namespaces,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
        max_concurrent_requests=max_concurrent_requests,
    )
    obj = ModelAccessKey(metadata=ObjectMeta(name=name, namespace=namespace), spec=spec)
    return yaml.safe_dump(obj.model_dump(mode="json", exclude_none=True), sort_keys=False)


def create_access_key(
    *,
    name: str,
    namespace: str,
    models: list[str],
    namespaces: list[str],
    requests_per_minute: int | None,
    tokens_per_minute: int | None,
    max_concurrent_requests: int | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    check_names(name=name, namespace=namespace)
    key = mint_key(namespace=namespace, name=name)
    manifest = access_key_manifest(
        name=name,
        namespace=namespace,
        key=key,
        models=models,
        namespaces=namespaces,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
        max_concurrent_requests=max_concurrent_requests,
    )
    print(
        f"API key for ModelAccessKey {namespace}/{name} (shown once; Kubernetes keeps only "
        f"its SHA-256):\n{key}",
        file=err,
    )
    out.write(manifest)
    return 0
