"""Shared building blocks of Kama's API types.

The custom resources (``ModelCache``, ``ModelArtifact``, ...) are defined once, as
pydantic models; the CRD YAML is generated from them (``kama.api.crd``). This module
holds what they share: the API group and version, the base model configurations
(camelCase on the wire, unknown spec fields rejected), the standard ``Condition``,
small object references, and ``CelRule``, which carries a CEL
``x-kubernetes-validations`` rule into the generated schema together with the message
the Python-side check raises, so both sides reject bad input with the same words.

Pure Python: no I/O, no Kubernetes client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = [
    "API_VERSION",
    "DNS_SUBDOMAIN_PATTERN",
    "FINALIZER",
    "GROUP",
    "RELATIVE_PATH_PATTERN",
    "VERSION",
    "WORKFLOW_ID_FIELD",
    "AccessMode",
    "CelRule",
    "Condition",
    "ConditionStatus",
    "DNSSubdomain",
    "KamaModel",
    "LocalObjectReference",
    "ObjectMeta",
    "SecretKeySelector",
    "SpecModel",
    "cel",
    "check_relative_path",
    "relative_path_rules",
]

GROUP: Final = "kama.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
FINALIZER: Final = "kama.dev/finalizer"
WORKFLOW_ID_FIELD: Final = "workflowID"
"""The status field every Kama resource names its Temporal workflow in (written by
the workflow itself; `kama status` and the Temporal UI take it as it is)."""
WORKFLOW_ID_MAX: Final = 1000  # Temporal's default limit on an ID, in bytes

# RFC 1123 subdomain, the rule for most Kubernetes object names.
DNS_SUBDOMAIN_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_SUBDOMAIN_MAX = 253
# The rules of metav1.Condition.
_CONDITION_TYPE_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_CONDITION_REASON_PATTERN: Final = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
_SECRET_KEY_PATTERN: Final = r"^[-._a-zA-Z0-9]+$"


@dataclass(frozen=True)
class CelRule:
    """One CEL ``x-kubernetes-validations`` rule of the generated CRD schema.

    ``message`` names the offending field (``spec.cacheRef ...``) because that is what
    a user reads in ``kubectl apply``'s error; the Python-side validators raise the
    same message. ``field_path`` (relative to the node carrying the rule, e.g.
    ``.cacheRef``) makes the apiserver report the error at that field; ``reason`` is
    one of ``FieldValueInvalid|FieldValueRequired|FieldValueForbidden|
    FieldValueDuplicate``. A rule that mentions ``oldSelf`` is a transition rule: the
    apiserver evaluates it only on updates.
    """

    rule: str
    message: str
    field_path: str | None = None
    reason: str | None = None

    def to_schema(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            out["fieldPath"] = self.field_path
        if self.reason is not None:
            out["reason"] = self.reason
        return out


def cel(*rules: CelRule) -> dict[str, Any]:
    """``json_schema_extra`` carrying CEL rules into the JSON schema of a model or field."""
    return {"x-kubernetes-validations": [r.to_schema() for r in rules]}


class KamaModel(BaseModel):
    """Base of every API type: snake_case in Python, camelCase on the wire.

    Unknown keys are ignored so that a status written by a newer Kama, or an object
    read back with server-set fields, still parses.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
        extra="ignore",
    )


class SpecModel(KamaModel):
    """Base of user-written spec types: unknown fields are an error, as on the apiserver
    (``kubectl apply`` validates fields strictly and the generated schema is closed)."""

    model_config = ConfigDict(extra="forbid")


DNSSubdomain = Annotated[
    str, Field(min_length=1, max_length=_DNS_SUBDOMAIN_MAX, pattern=DNS_SUBDOMAIN_PATTERN)
]


class AccessMode(StrEnum):
    """A PersistentVolume access mode."""

    READ_WRITE_ONCE = "ReadWriteOnce"
    READ_WRITE_MANY = "ReadWriteMany"
    READ_ONLY_MANY = "ReadOnlyMany"
    READ_WRITE_ONCE_POD = "ReadWriteOncePod"


class ConditionStatus(StrEnum):
    """The status of a condition."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(KamaModel):
    """One aspect of an object's current state (the shape of metav1.Condition)."""

    type: str = Field(max_length=316, pattern=_CONDITION_TYPE_PATTERN)
    """Type of the condition, in CamelCase (e.g. Ready)."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: str = Field(min_length=1, max_length=1024, pattern=_CONDITION_REASON_PATTERN)
    """A CamelCase, machine-readable reason for the last transition."""
    message: str = Field(default="", max_length=32768)
    """A human-readable explanation of the last transition."""
    last_transition_time: datetime
    """When the status last changed."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation the condition was computed from."""


class LocalObjectReference(SpecModel):
    """A reference to an object in the same namespace."""

    name: DNSSubdomain
    """Name of the referenced object."""


class SecretKeySelector(SpecModel):
    """One key of a Secret in the same namespace."""

    name: DNSSubdomain
    """Name of the Secret."""
    key: str = Field(min_length=1, max_length=253, pattern=_SECRET_KEY_PATTERN)
    """Key within the Secret's data."""


class ObjectMeta(BaseModel):
    """The part of metadata Kama reads and writes; everything else is kept as is.

    The generated CRD leaves metadata to the apiserver (``type: object``).
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="allow",
    )

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    finalizers: list[str] | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None


# ----- relative paths --------------------------------------------------------------


def relative_path_rules(field: str) -> tuple[CelRule, ...]:
    """CEL rules for a relative path inside a volume or repository, with messages naming
    ``field``. Kept as CEL (not one large RE2 pattern) so that each mistake gets a
    readable message; the Python check is ``check_relative_path``."""
    return (
        CelRule(
            rule="!self.startsWith('/')",
            message=f"{field} must be a relative path (must not start with '/')",
        ),
        CelRule(
            rule="!self.contains('\\\\')",
            message=f"{field} must use '/' as separator (no backslash)",
        ),
        CelRule(
            rule="self.split('/').all(s, s != '' && s != '.' && s != '..')",
            message=f"{field} must not contain '..', '.' or empty path segments",
        ),
    )


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Also written into the schema, where it rejects control characters.
RELATIVE_PATH_PATTERN: Final = r"^[^\x00-\x1f\x7f]+$"


def check_relative_path(value: str, *, field: str) -> str:
    """The Python side of ``relative_path_rules`` (same messages, same order)."""
    first, second, third = relative_path_rules(field)
    if value.startswith("/"):
        raise ValueError(first.message)
    if "\\" in value:
        raise ValueError(second.message)
    if any(s in ("", ".", "..") for s in value.split("/")):
        raise ValueError(third.message)
    if _CONTROL.search(value):
        raise ValueError(f"{field} must not contain control characters")
    return value
