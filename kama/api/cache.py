"""The ModelCache resource: a durable storage pool that imported artifacts live in.

A cache is either an existing PersistentVolumeClaim (Kama never owns or deletes it) or
a claim template from which Kama creates the claim itself. These models are the single
source of truth for the ``modelcaches.kama.dev`` CRD (see ``kama.api.crd``); every CEL
rule of the schema is also checked here, in Python, with the same message, except the
transition rules, which need the previous object and only the apiserver has it.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Final, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from kama.api.meta import (
    DNS_SUBDOMAIN_PATTERN,
    WORKFLOW_ID_FIELD,
    WORKFLOW_ID_MAX,
    AccessMode,
    CelRule,
    Condition,
    DNSSubdomain,
    KamaModel,
    ObjectMeta,
    SpecModel,
    cel,
)

__all__ = [
    "ACCESS_MODES_IMMUTABLE_RULE",
    "CACHE_SPEC_RULES",
    "CLAIM_IMMUTABLE_RULE",
    "CLAIM_TEMPLATE_RULES",
    "DELETE_NEEDS_TEMPLATE_RULE",
    "MODELCACHE_KIND",
    "MODELCACHE_PLURAL",
    "MODELCACHE_SHORT_NAME",
    "MODELCACHE_SINGULAR",
    "ONE_STORAGE_RULE",
    "QUANTITY_PATTERN",
    "SIZE_NO_SHRINK_RULE",
    "STORAGE_CLASS_IMMUTABLE_RULE",
    "CacheConditionType",
    "ClaimTemplate",
    "ExistingClaim",
    "ModelCache",
    "ModelCacheSpec",
    "ModelCacheStatus",
    "RetentionPolicy",
]

MODELCACHE_KIND: Final = "ModelCache"
MODELCACHE_PLURAL: Final = "modelcaches"
MODELCACHE_SINGULAR: Final = "modelcache"
MODELCACHE_SHORT_NAME: Final = "mc"

# A non-negative Kubernetes quantity (no sign, no milli/micro/nano suffixes: bytes).
QUANTITY_PATTERN: Final = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"


class RetentionPolicy(StrEnum):
    """What happens to the claim when the ModelCache is deleted."""

    RETAIN = "Retain"
    DELETE = "Delete"


class CacheConditionType(StrEnum):
    """Condition types of a ModelCache."""

    READY = "Ready"
    STORAGE_UNAVAILABLE = "StorageUnavailable"
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"


ONE_STORAGE_RULE: Final = CelRule(
    rule="has(self.persistentVolumeClaim) != has(self.claimTemplate)",
    message="exactly one of spec.persistentVolumeClaim or spec.claimTemplate must be set",
)
DELETE_NEEDS_TEMPLATE_RULE: Final = CelRule(
    rule=(
        "!has(self.retentionPolicy) || self.retentionPolicy != 'Delete' || has(self.claimTemplate)"
    ),
    message=(
        "spec.retentionPolicy Delete is only allowed with spec.claimTemplate"
        " (a claim named in spec.persistentVolumeClaim is never deleted)"
    ),
    field_path=".retentionPolicy",
)
CLAIM_IMMUTABLE_RULE: Final = CelRule(
    rule=(
        "has(self.persistentVolumeClaim) == has(oldSelf.persistentVolumeClaim)"
        " && (!has(self.persistentVolumeClaim)"
        " || self.persistentVolumeClaim == oldSelf.persistentVolumeClaim)"
    ),
    message=(
        "spec.persistentVolumeClaim is immutable: a cache cannot move to another claim"
        " or switch between spec.persistentVolumeClaim and spec.claimTemplate"
    ),
    field_path=".persistentVolumeClaim",
)
CACHE_SPEC_RULES: Final = (ONE_STORAGE_RULE, DELETE_NEEDS_TEMPLATE_RULE, CLAIM_IMMUTABLE_RULE)
"""CEL rules on ModelCache.spec."""

STORAGE_CLASS_IMMUTABLE_RULE: Final = CelRule(
    rule=(
        "has(self.storageClassName) == has(oldSelf.storageClassName)"
        " && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)"
    ),
    message="spec.claimTemplate.storageClassName is immutable",
    field_path=".storageClassName",
)
ACCESS_MODES_IMMUTABLE_RULE: Final = CelRule(
    rule=(
        "has(self.accessModes) == has(oldSelf.accessModes)"
        " && (!has(self.accessModes) || self.accessModes == oldSelf.accessModes)"
    ),
    message="spec.claimTemplate.accessModes is immutable",
    field_path=".accessModes",
)
CLAIM_TEMPLATE_RULES: Final = (STORAGE_CLASS_IMMUTABLE_RULE, ACCESS_MODES_IMMUTABLE_RULE)
"""CEL transition rules on ModelCache.spec.claimTemplate (its size may still grow)."""

SIZE_NO_SHRINK_RULE: Final = CelRule(
    rule="quantity(self).compareTo(quantity(oldSelf)) >= 0",
    message="spec.claimTemplate.size is immutable except to grow (a claim cannot shrink)",
)
"""CEL transition rule on ModelCache.spec.claimTemplate.size (Kubernetes quantity library)."""


class ExistingClaim(SpecModel):
    """An existing PersistentVolumeClaim in the cache's namespace. Kama uses it but never
    owns, resizes or deletes it."""

    claim_name: DNSSubdomain
    """Name of the PersistentVolumeClaim."""


class ClaimTemplate(SpecModel):
    """A PersistentVolumeClaim that Kama creates (and owns) for this cache."""

    model_config = ConfigDict(json_schema_extra=cel(*CLAIM_TEMPLATE_RULES))

    storage_class_name: str | None = Field(
        default=None, max_length=253, pattern=f"^$|{DNS_SUBDOMAIN_PATTERN}"
    )
    """StorageClass of the claim; omitted: the cluster default; empty: no class."""
    size: str = Field(
        min_length=1,
        max_length=64,
        pattern=QUANTITY_PATTERN,
        json_schema_extra=cel(SIZE_NO_SHRINK_RULE),
    )
    """Requested capacity, a quantity such as 200Gi. It may grow (if the StorageClass
    allows expansion), never shrink."""
    access_modes: list[AccessMode] = Field(
        default=[AccessMode.READ_WRITE_ONCE],
        min_length=1,
        max_length=4,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    """Access modes of the claim. ReadWriteMany lets replicas on several nodes serve
    from the cache."""


class ModelCacheSpec(SpecModel):
    """Where the cache's bytes live: exactly one of persistentVolumeClaim or
    claimTemplate."""

    model_config = ConfigDict(json_schema_extra=cel(*CACHE_SPEC_RULES))

    persistent_volume_claim: ExistingClaim | None = None
    """Use an existing claim (never owned or deleted by Kama)."""
    claim_template: ClaimTemplate | None = None
    """Let Kama create the claim."""
    retention_policy: RetentionPolicy = RetentionPolicy.RETAIN
    """Retain (default) keeps the claim when the cache is deleted; Delete removes a
    claim Kama created once no artifact references the cache."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if (self.persistent_volume_claim is None) == (self.claim_template is None):
            raise ValueError(ONE_STORAGE_RULE.message)
        if self.retention_policy is RetentionPolicy.DELETE and self.claim_template is None:
            raise ValueError(DELETE_NEEDS_TEMPLATE_RULE.message)
        return self


class ModelCacheStatus(KamaModel):
    """Observed state of a ModelCache."""

    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation this status was computed from."""
    workflow_id: str | None = Field(
        default=None, alias=WORKFLOW_ID_FIELD, max_length=WORKFLOW_ID_MAX
    )
    """The Temporal workflow that keeps this resource (open it in the Temporal UI, or
    `temporal workflow describe -w <id>`)."""
    claim_name: str | None = Field(default=None, max_length=253)
    """The PersistentVolumeClaim backing the cache."""
    capacity: str | None = Field(default=None, max_length=64)
    """Capacity of the bound claim (from its status), a quantity."""
    access_modes: list[AccessMode] = Field(default_factory=list, max_length=4)
    """Access modes of the bound claim."""
    free_bytes: int | None = Field(default=None, ge=0)
    """Free bytes on the volume, as last reported by an importer."""
    free_reported_at: datetime | None = None
    """When freeBytes was reported."""
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Ready, StorageUnavailable, InsufficientCapacity."""


class ModelCache(KamaModel):
    """A durable storage pool for imported GGUF artifacts: an existing
    PersistentVolumeClaim or one Kama creates from a template."""

    api_version: Literal["kama.dev/v1alpha1"] = "kama.dev/v1alpha1"
    kind: Literal["ModelCache"] = "ModelCache"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ModelCacheSpec
    status: ModelCacheStatus | None = None
