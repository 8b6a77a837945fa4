"""The ModelAccessKey resource: one API key of the gateway, as its SHA-256 and grants.

A tenant mints a key, keeps it, and creates a ModelAccessKey in its own namespace
holding only the key's SHA-256 (``kama access-key create`` does both). A key names the
object it belongs to: ``kama_<namespace>_<name>_<secret>`` (neither a namespace nor an
object name can hold ``_``; the secret is at least ``MIN_SECRET_CHARS`` URL-safe
characters). The gateway checks a key against that one object's hash, so a hash
copied into another object grants nothing and a library default such as ``EMPTY``
(not in this format) is no key whatever object holds its hash. It watches these
objects and answers a request with its key's object's grants; it never sees a Secret, so the internet-facing process
needs no read access to Secrets anywhere (see the README, "API keys"). Rotation is
create-new, switch clients, delete-old; both keys work in between.

What a key grants: the models of its own namespace (all of them, or those in
``models``), and with ``namespaces`` models of other namespaces too, which the gateway
honours only when its operator allowed cross-namespace grants (the chart's
``gateway.auth.allowCrossNamespaceGrants``): otherwise any tenant could grant itself
another tenant's models. ``requestsPerMinute`` and ``tokensPerMinute`` bound what the
key may use per gateway replica.

These models are the single source of truth for the ``modelaccesskeys.kama.dev`` CRD
(``kama.api.crd``). Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Final, Literal

from pydantic import Field

from kama.api.meta import KamaModel, ObjectMeta, SpecModel

__all__ = [
    "KEY_PREFIX",
    "KEY_SHA256_PATTERN",
    "MIN_SECRET_CHARS",
    "MODELACCESSKEY_KIND",
    "MODELACCESSKEY_PLURAL",
    "MODELACCESSKEY_SHORT_NAME",
    "MODELACCESSKEY_SINGULAR",
    "ModelAccessKey",
    "ModelAccessKeySpec",
    "key_object",
    "key_sha256",
    "minted_key",
]

MODELACCESSKEY_KIND: Final = "ModelAccessKey"
MODELACCESSKEY_PLURAL: Final = "modelaccesskeys"
MODELACCESSKEY_SINGULAR: Final = "modelaccesskey"
MODELACCESSKEY_SHORT_NAME: Final = "mak"

KEY_SHA256_PATTERN: Final = r"^[0-9a-f]{64}$"
_NAMESPACE_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# a ModelDeployment's name, or <namespace>/<name> for one in a granted namespace
_MODEL_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?"
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
MAX_GRANTS: Final = 64
KEY_PREFIX: Final = "kama_"
MIN_SECRET_CHARS: Final = 32  # `kama access-key create` mints 43 (256 bits)
_LABEL: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_MINTED_KEY: Final = re.compile(
    rf"{KEY_PREFIX}(?P<namespace>{_LABEL})_(?P<name>{_LABEL}(\.{_LABEL})*)_"
    rf"(?P<secret>[A-Za-z0-9_-]{{{MIN_SECRET_CHARS},}})"
)
_MAX_NAMESPACE: Final = 63
_MAX_NAME: Final = 253

NamespaceName = Annotated[str, Field(min_length=1, max_length=63, pattern=_NAMESPACE_PATTERN)]
ModelName = Annotated[str, Field(min_length=1, max_length=317, pattern=_MODEL_PATTERN)]


def key_sha256(key: str) -> str:
    """What a ModelAccessKey stores of `key`: its SHA-256, lower-case hex."""
    return hashlib.sha256(key.encode()).hexdigest()


def minted_key(*, namespace: str, name: str, secret: str) -> str:
    """The key of ModelAccessKey `namespace`/`name` with this secret (see the module's
    doc); ValueError when the three do not make one."""
    key = f"{KEY_PREFIX}{namespace}_{name}_{secret}"
    if key_object(key) != (namespace, name):
        raise ValueError(
            f"{namespace!r}/{name!r} with that secret is not a key: a namespace and an object "
            f"name, and a secret of at least {MIN_SECRET_CHARS} of A-Z a-z 0-9 _ -"
        )
    return key


def key_object(key: str) -> tuple[str, str] | None:
    """The namespace and name of the ModelAccessKey a key names, or None for anything
    that is not a key in the minted format."""
    found = _MINTED_KEY.fullmatch(key)
    if found is None:
        return None
    namespace, name = found["namespace"], found["name"]
    if len(namespace) > _MAX_NAMESPACE or len(name) > _MAX_NAME:
        return None
    return namespace, name


class ModelAccessKeySpec(SpecModel):
    """One API key of the gateway: its hash, what it may use, and how much."""

    key_sha256: str = Field(
        alias="keySHA256", min_length=64, max_length=64, pattern=KEY_SHA256_PATTERN
    )
    """SHA-256 of the key, 64 lower-case hex digits (`printf %s "$KEY" | sha256sum`).
    The key itself is never stored; it reads kama_<namespace>_<name>_<secret>, naming
    this object. Two objects holding the same hash are both refused."""
    models: list[ModelName] = Field(
        default_factory=list,
        max_length=MAX_GRANTS,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    """ModelDeployments the key may use: a name (in this namespace) or
    <namespace>/<name> (in a namespace of `namespaces`). Empty: every model of every
    namespace the key grants."""
    namespaces: list[NamespaceName] = Field(
        default_factory=list,
        max_length=MAX_GRANTS,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    """Namespaces besides this one whose models the key may use. Honoured only where
    the gateway's operator allows cross-namespace grants (chart value
    gateway.auth.allowCrossNamespaceGrants); ignored otherwise."""
    requests_per_minute: int | None = Field(default=None, ge=1, le=10_000_000)
    """At most this many requests per minute (per gateway replica); unset: no limit.
    Past it the gateway answers 429 with Retry-After."""
    tokens_per_minute: int | None = Field(default=None, ge=1, le=10_000_000_000)
    """At most this many tokens (prompt + completion, as the model reports them) per
    minute (per gateway replica); unset: no limit. A request reserves what it may use
    when it is admitted (its max_tokens and prompt, or the model's context where it
    names no maximum) and is settled to what its answer states; one that does not fit
    gets 429 with Retry-After. An answer that states no usage (a stream cut short)
    keeps its reservation."""
    max_concurrent_requests: int | None = Field(default=None, ge=1, le=100_000)
    """At most this many requests of the key in progress at once (per gateway
    replica); unset: no cap of its own. Past it the gateway answers 429."""
    disabled: bool = False
    """Refuse the key (401) without deleting it."""


class ModelAccessKey(KamaModel):
    """An API key of the Kama gateway, held only as its SHA-256, and what it grants."""

    api_version: Literal["kama.dev/v1alpha1"] = "kama.dev/v1alpha1"
    kind: Literal["ModelAccessKey"] = "ModelAccessKey"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ModelAccessKeySpec
