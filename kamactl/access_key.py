"""`kama access-key create`: mint an API key for the gateway and the ModelAccessKey
that lets the gateway recognise it.

The key is random (256 bits from `secrets`), printed once on stderr, and never stored:
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

from kama.api import ModelAccessKey, ModelAccessKeySpec, ObjectMeta, key_sha256
from kama.api.meta import DNS_SUBDOMAIN_PATTERN

KEY_PREFIX = "kama_"


def mint_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def access_key_manifest(
    *,
    name: str,
    namespace: str,
    key: str,
    models: list[str],
    namespaces: list[str],
    requests_per_minute: int | None,
    tokens_per_minute: int | None,
) -> str:
    """The ModelAccessKey for `key` as YAML (validated as the CRD validates it)."""
    for what, value in (("name", name), ("namespace", namespace)):
        if len(value) > 253 or not re.match(DNS_SUBDOMAIN_PATTERN, value):
            raise ValueError(f"{what} {value!r} is not a valid Kubernetes name")
    spec = ModelAccessKeySpec(
        key_sha256=key_sha256(key),
        models=models,
        namespaces=namespaces,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
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
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    key = mint_key()
    manifest = access_key_manifest(
        name=name,
        namespace=namespace,
        key=key,
        models=models,
        namespaces=namespaces,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
    )
    print(
        f"API key for ModelAccessKey {namespace}/{name} (shown once; Kubernetes keeps only "
        f"its SHA-256):\n{key}",
        file=err,
    )
    out.write(manifest)
    return 0
