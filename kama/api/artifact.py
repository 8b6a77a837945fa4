"""The ModelArtifact resource: one immutable GGUF model (a file or a complete shard set),
optionally with the multimodal projector that goes with it.

An artifact names where the bytes come from (a Hugging Face repository, or a path in an
existing PersistentVolumeClaim), which ModelCache they are published into, and
optionally the digest and size they must have. Its status reports what the import
found: files with sizes and digests, the GGUF facts the planner needs, and where a
serving pod finds the model. These models are the single source of truth for the
``modelartifacts.kama.dev`` CRD (see ``kama.api.crd``); each CEL rule of the schema is
checked here too, with the same message, except the transition (immutability) rules,
which need the previous object and only the apiserver has it.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Final, Literal, Self

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from kama.api.gguf_info import GGUFInfo
from kama.api.meta import (
    RELATIVE_PATH_PATTERN,
    WORKFLOW_ID_FIELD,
    WORKFLOW_ID_MAX,
    AccessMode,
    CelRule,
    Condition,
    DNSSubdomain,
    KamaModel,
    LocalObjectReference,
    ObjectMeta,
    SecretKeySelector,
    SpecModel,
    cel,
    check_relative_path,
    relative_path_rules,
)

__all__ = [
    "ARTIFACT_SPEC_RULES",
    "CACHE_FORBIDDEN_FOR_DIRECT_RULE",
    "CACHE_REF_IMMUTABLE_RULE",
    "CACHE_REQUIRED_FOR_COPY_RULE",
    "CACHE_REQUIRED_FOR_HF_RULE",
    "ENTRYPOINT_IMMUTABLE_RULE",
    "ENTRYPOINT_RULES",
    "EXPECTED_SHA256_IMMUTABLE_RULE",
    "EXPECTED_SIZE_IMMUTABLE_RULE",
    "HF_FILES_RULES",
    "HF_FILE_RULES",
    "HF_REPO_PATTERN",
    "MAX_FILES",
    "MODELARTIFACT_KIND",
    "MODELARTIFACT_PLURAL",
    "MODELARTIFACT_SHORT_NAME",
    "MODELARTIFACT_SINGULAR",
    "ONE_SOURCE_RULE",
    "PVC_PATH_RULES",
    "REVISION_RULES",
    "SHA256_HEX_PATTERN",
    "SOURCE_IMMUTABLE_RULE",
    "ArtifactCondition",
    "ArtifactFile",
    "ArtifactPhase",
    "ArtifactSource",
    "HuggingFaceSource",
    "ImportProgress",
    "ModelArtifact",
    "ModelArtifactSpec",
    "ModelArtifactStatus",
    "PVCSourceMode",
    "PersistentVolumeClaimSource",
    "ServingLocation",
    "short_digest_of",
]

MODELARTIFACT_KIND: Final = "ModelArtifact"
MODELARTIFACT_PLURAL: Final = "modelartifacts"
MODELARTIFACT_SINGULAR: Final = "modelartifact"
MODELARTIFACT_SHORT_NAME: Final = "ma"

MAX_FILES: Final = 128
_MAX_FILE_NAME = 512
_MAX_PATH = 1024
# owner/name as on the Hub: alphanumerics, '-', '_', '.', at most 96 characters each.
HF_REPO_PATTERN: Final = (
    r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9]([A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$"
)
_REVISION_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"
SHA256_HEX_PATTERN: Final = r"^[0-9a-f]{64}$"
_DIGEST_PATTERN: Final = r"^sha256:[0-9a-f]{64}$"
_SHORT_DIGEST_LEN = 12
# The only '*' allowed in spec.source.huggingFace.files: a shard pattern.
_SHARD_PATTERN: Final = r"^[^*]+-[*]-of-([*]|[0-9]{5})[.]gguf$"


class PVCSourceMode(StrEnum):
    """How an artifact from a PersistentVolumeClaim is served."""

    COPY = "Copy"
    DIRECT = "Direct"


class ArtifactPhase(StrEnum):
    """Coarse lifecycle of an artifact; conditions carry the details."""

    PENDING = "Pending"
    RESOLVING = "Resolving"
    IMPORTING = "Importing"
    VERIFYING = "Verifying"
    READY = "Ready"
    FAILED = "Failed"


class ArtifactCondition(StrEnum):
    """Condition types of a ModelArtifact."""

    SOURCE_RESOLVED = "SourceResolved"
    IMPORTING = "Importing"
    VERIFIED = "Verified"
    READY = "Ready"
    CHECKSUM_MISMATCH = "ChecksumMismatch"
    INVALID_GGUF = "InvalidGGUF"
    MISSING_SHARD = "MissingShard"
    INSUFFICIENT_STORAGE = "InsufficientStorage"
    SOURCE_UNAVAILABLE = "SourceUnavailable"
    STORAGE_UNAVAILABLE = "StorageUnavailable"


# ----- CEL rules (messages shared with the Python checks) ---------------------------

_HF_FILES_FIELD = "spec.source.huggingFace.files"
HF_FILE_RULES: Final = (
    *relative_path_rules(f"{_HF_FILES_FIELD} entries"),
    CelRule(
        rule=f"!self.contains('*') || self.matches('{_SHARD_PATTERN}')",
        message=(
            f"{_HF_FILES_FIELD} entries may contain '*' only as a shard pattern"
            " such as model-*-of-*.gguf or model-*-of-00003.gguf"
        ),
    ),
)
"""CEL rules on each entry of spec.source.huggingFace.files."""

HF_FILES_RULES: Final = (
    CelRule(
        rule="!self.exists(f, f.contains('*')) || self.size() == 1",
        message=(
            f"{_HF_FILES_FIELD} must list file names or a single shard pattern"
            " (such as model-*-of-*.gguf), not both"
        ),
    ),
)
"""CEL rules on the spec.source.huggingFace.files list."""

REVISION_RULES: Final = (
    CelRule(
        rule="!self.contains('..')",
        message="spec.source.huggingFace.revision must not contain '..'",
    ),
)

PVC_PATH_RULES: Final = relative_path_rules("spec.source.persistentVolumeClaim.path")

ENTRYPOINT_RULES: Final = relative_path_rules("spec.entrypoint")

ONE_SOURCE_RULE: Final = CelRule(
    rule="has(self.huggingFace) != has(self.persistentVolumeClaim)",
    message=(
        "exactly one of spec.source.huggingFace or spec.source.persistentVolumeClaim must be set"
    ),
)

_HAS_PVC = "has(self.source) && has(self.source.persistentVolumeClaim)"
_IS_DIRECT = (
    "has(self.source.persistentVolumeClaim.mode)"
    " && self.source.persistentVolumeClaim.mode == 'Direct'"
)
CACHE_REQUIRED_FOR_HF_RULE: Final = CelRule(
    rule="!has(self.source) || !has(self.source.huggingFace) || has(self.cacheRef)",
    message="spec.cacheRef is required for huggingFace sources",
    field_path=".cacheRef",
    reason="FieldValueRequired",
)
CACHE_REQUIRED_FOR_COPY_RULE: Final = CelRule(
    rule=f"!({_HAS_PVC}) || ({_IS_DIRECT}) || has(self.cacheRef)",
    message="spec.cacheRef is required for persistentVolumeClaim sources in Copy mode",
    field_path=".cacheRef",
    reason="FieldValueRequired",
)
CACHE_FORBIDDEN_FOR_DIRECT_RULE: Final = CelRule(
    rule=f"!({_HAS_PVC}) || !({_IS_DIRECT}) || !has(self.cacheRef)",
    message=(
        "spec.cacheRef is forbidden for persistentVolumeClaim sources in Direct mode"
        " (the artifact is served from the source claim)"
    ),
    field_path=".cacheRef",
    reason="FieldValueForbidden",
)


def _immutable_once_set(field: str) -> CelRule:
    return CelRule(
        rule=(f"!has(oldSelf.{field}) || (has(self.{field}) && self.{field} == oldSelf.{field})"),
        message=f"spec.{field} is immutable once set",
        field_path=f".{field}",
    )


SOURCE_IMMUTABLE_RULE: Final = _immutable_once_set("source")
CACHE_REF_IMMUTABLE_RULE: Final = _immutable_once_set("cacheRef")
EXPECTED_SHA256_IMMUTABLE_RULE: Final = _immutable_once_set("expectedSHA256")
EXPECTED_SIZE_IMMUTABLE_RULE: Final = _immutable_once_set("expectedSize")
ENTRYPOINT_IMMUTABLE_RULE: Final = _immutable_once_set("entrypoint")

ARTIFACT_SPEC_RULES: Final = (
    CACHE_REQUIRED_FOR_HF_RULE,
    CACHE_REQUIRED_FOR_COPY_RULE,
    CACHE_FORBIDDEN_FOR_DIRECT_RULE,
    SOURCE_IMMUTABLE_RULE,
    CACHE_REF_IMMUTABLE_RULE,
    EXPECTED_SHA256_IMMUTABLE_RULE,
    EXPECTED_SIZE_IMMUTABLE_RULE,
    ENTRYPOINT_IMMUTABLE_RULE,
)
"""CEL rules on ModelArtifact.spec (the last five are transition rules)."""


# ----- spec ---------------------------------------------------------------------------


def _check_hf_file(value: str) -> str:
    check_relative_path(value, field=f"{_HF_FILES_FIELD} entries")
    if "*" in value and not re.search(_SHARD_PATTERN, value):
        raise ValueError(HF_FILE_RULES[-1].message)
    return value


def _check_hf_files(value: list[str]) -> list[str]:
    if any("*" in f for f in value) and len(value) != 1:
        raise ValueError(HF_FILES_RULES[0].message)
    if len(set(value)) != len(value):
        raise ValueError(f"{_HF_FILES_FIELD} must not list a file twice")
    return value


def _check_revision(value: str) -> str:
    if ".." in value:
        raise ValueError(REVISION_RULES[0].message)
    return value


def _check_pvc_path(value: str) -> str:
    return check_relative_path(value, field="spec.source.persistentVolumeClaim.path")


def _check_entrypoint(value: str) -> str:
    return check_relative_path(value, field="spec.entrypoint")


HuggingFaceFile = Annotated[
    str,
    Field(
        min_length=1,
        max_length=_MAX_FILE_NAME,
        pattern=RELATIVE_PATH_PATTERN,
        json_schema_extra=cel(*HF_FILE_RULES),
    ),
    AfterValidator(_check_hf_file),
]


class HuggingFaceSource(SpecModel):
    """Files of a Hugging Face model repository."""

    repo: str = Field(max_length=193, pattern=HF_REPO_PATTERN)
    """Repository id, owner/name (e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF)."""
    revision: Annotated[
        str,
        Field(max_length=255, pattern=_REVISION_PATTERN, json_schema_extra=cel(*REVISION_RULES)),
        AfterValidator(_check_revision),
    ] = "main"
    """Branch, tag or commit. A branch or tag is resolved once to a full commit
    (status.resolvedCommit); a full commit is preferred."""
    files: Annotated[
        list[HuggingFaceFile],
        Field(
            min_length=1,
            max_length=MAX_FILES,
            json_schema_extra={"x-kubernetes-list-type": "set", **cel(*HF_FILES_RULES)},
        ),
        AfterValidator(_check_hf_files),
    ]
    """Paths of the GGUF files in the repository: one file, the files of one shard set,
    or one shard pattern such as model-*-of-*.gguf (or the first shard's name,
    model-00001-of-00003.gguf) that stands for the complete set. A model's files may be
    listed with its multimodal projector (e.g. mmproj-model-f16.gguf)."""
    token_secret_ref: SecretKeySelector | None = None
    """Secret key (same namespace) holding a Hugging Face access token, for gated or
    private repositories."""


class PersistentVolumeClaimSource(SpecModel):
    """A GGUF file or shard set already present in a PersistentVolumeClaim."""

    claim_name: DNSSubdomain
    """Name of the PersistentVolumeClaim (same namespace)."""
    path: Annotated[
        str,
        Field(
            min_length=1,
            max_length=_MAX_PATH,
            pattern=RELATIVE_PATH_PATTERN,
            json_schema_extra=cel(*PVC_PATH_RULES),
        ),
        AfterValidator(_check_pvc_path),
    ]
    """Path of the GGUF file (or of the first shard) relative to the volume root."""
    mode: PVCSourceMode = PVCSourceMode.COPY
    """Copy (default) publishes the files into spec.cacheRef; Direct validates them in
    place and serves from this claim, read-only (spec.cacheRef must then be omitted)."""


class ArtifactSource(SpecModel):
    """Where the model's bytes come from: exactly one of huggingFace or
    persistentVolumeClaim."""

    model_config = ConfigDict(json_schema_extra=cel(ONE_SOURCE_RULE))

    hugging_face: HuggingFaceSource | None = None
    """Download from a Hugging Face repository."""
    persistent_volume_claim: PersistentVolumeClaimSource | None = None
    """Take the files from an existing PersistentVolumeClaim."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if (self.hugging_face is None) == (self.persistent_volume_claim is None):
            raise ValueError(ONE_SOURCE_RULE.message)
        return self


class ModelArtifactSpec(SpecModel):
    """What to import. Source, cacheRef, expectedSHA256, expectedSize and entrypoint
    cannot be changed once set: create a new artifact instead."""

    model_config = ConfigDict(json_schema_extra=cel(*ARTIFACT_SPEC_RULES))

    source: ArtifactSource
    """Where the model's bytes come from."""
    cache_ref: LocalObjectReference | None = None
    """The ModelCache (same namespace) the artifact is published into. Required for
    huggingFace sources and persistentVolumeClaim sources in Copy mode, forbidden in
    Direct mode."""
    expected_sha256: str | None = Field(
        default=None, alias="expectedSHA256", max_length=64, pattern=SHA256_HEX_PATTERN
    )
    """Lowercase hex SHA-256 the model must have: of the file for a single-file
    artifact, the artifact digest (status.artifactDigest) for a shard set."""
    expected_size: int | None = Field(default=None, ge=1)
    """Total size in bytes the model's files must have."""
    entrypoint: (
        Annotated[
            str,
            Field(
                min_length=1,
                max_length=_MAX_PATH,
                pattern=RELATIVE_PATH_PATTERN,
                json_schema_extra=cel(*ENTRYPOINT_RULES),
            ),
            AfterValidator(_check_entrypoint),
        ]
        | None
    ) = None
    """The file llama-server serves as the model (for a shard set, its first shard): one
    of spec.source.huggingFace.files, or a file name in the directory at
    spec.source.persistentVolumeClaim.path. Required when the selected files hold more
    than one candidate model; a multimodal projector (mmproj) is never one."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        pvc = self.source.persistent_volume_claim
        if self.source.hugging_face is not None and self.cache_ref is None:
            raise ValueError(CACHE_REQUIRED_FOR_HF_RULE.message)
        if pvc is not None and pvc.mode is PVCSourceMode.COPY and self.cache_ref is None:
            raise ValueError(CACHE_REQUIRED_FOR_COPY_RULE.message)
        if pvc is not None and pvc.mode is PVCSourceMode.DIRECT and self.cache_ref is not None:
            raise ValueError(CACHE_FORBIDDEN_FOR_DIRECT_RULE.message)
        return self


# ----- status -------------------------------------------------------------------------


def short_digest_of(digest: str) -> str:
    """The first 12 hex characters of a ``sha256:<hex>`` (or bare hex) digest."""
    return digest.removeprefix("sha256:")[:_SHORT_DIGEST_LEN]


class ArtifactFile(KamaModel):
    """One file of the artifact."""

    path: str = Field(max_length=_MAX_PATH)
    """Path relative to the artifact root."""
    size: int = Field(ge=0)
    """Size in bytes."""
    sha256: str = Field(max_length=64, pattern=SHA256_HEX_PATTERN)
    """Lowercase hex SHA-256 of the file."""


class ServingLocation(KamaModel):
    """Where serving pods mount the artifact from."""

    claim_name: str = Field(max_length=253)
    """PersistentVolumeClaim holding the artifact (the cache's or, in Direct mode, the
    source claim)."""
    sub_path: str = Field(default="", max_length=_MAX_PATH)
    """Directory (or file) of the artifact inside the claim."""
    access_modes: list[AccessMode] = Field(default_factory=list, max_length=4)
    """Access modes of the claim."""
    node_affinity: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """A core/v1 VolumeNodeAffinity-style constraint on the nodes that can mount the
    claim (e.g. copied from a local PersistentVolume), or omitted."""


class ImportProgress(KamaModel):
    """How far the current import is."""

    bytes_done: int = Field(default=0, ge=0)
    """Bytes downloaded or copied (and hashed) so far."""
    bytes_total: int | None = Field(default=None, ge=0)
    """Bytes to transfer in all, when known."""


class ModelArtifactStatus(KamaModel):
    """Observed state of a ModelArtifact."""

    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation this status was computed from."""
    workflow_id: str | None = Field(
        default=None, alias=WORKFLOW_ID_FIELD, max_length=WORKFLOW_ID_MAX
    )
    """The Temporal workflow that keeps this resource (open it in the Temporal UI, or
    `temporal workflow describe -w <id>`)."""
    phase: ArtifactPhase | None = None
    """Pending, Resolving, Importing, Verifying, Ready or Failed."""
    resolved_commit: str | None = Field(default=None, max_length=64, pattern=r"^[0-9a-f]{40,64}$")
    """The full commit spec.source.huggingFace.revision resolved to."""
    files: list[ArtifactFile] = Field(default_factory=list, max_length=1024)
    """Every file of the artifact, sorted by path."""
    manifest_digest: str | None = Field(default=None, max_length=71, pattern=_DIGEST_PATTERN)
    """sha256:<hex> of the artifact's manifest in the cache (its publication key)."""
    artifact_digest: str | None = Field(default=None, max_length=71, pattern=_DIGEST_PATTERN)
    """sha256:<hex> identifying the model content."""
    short_digest: str | None = Field(default=None, max_length=12, pattern=r"^[0-9a-f]{12}$")
    """First 12 hex characters of artifactDigest (for kubectl get)."""
    total_size: int | None = Field(default=None, ge=0)
    """Total size of the files in bytes."""
    entrypoint: str | None = Field(default=None, max_length=_MAX_PATH)
    """The model file llama-server serves (for a shard set, its first shard), relative
    to the artifact root."""
    projector: str | None = Field(default=None, max_length=_MAX_PATH)
    """The multimodal projector file (general.type mmproj) next to the model, if the
    artifact has one, relative to the artifact root."""
    gguf: GGUFInfo | None = None
    """Facts from the GGUF header(s) of the model (the entrypoint's file or shard set)."""
    serving_location: ServingLocation | None = None
    """Where serving pods mount the artifact; set once it is Ready."""
    progress: ImportProgress | None = None
    """Progress of the running import."""
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """SourceResolved, Importing, Verified, Ready, ChecksumMismatch, InvalidGGUF,
    MissingShard, InsufficientStorage (the cache has too little free space),
    StorageUnavailable (the ModelCache or a claim does not exist), SourceUnavailable."""


class ModelArtifact(KamaModel):
    """One immutable GGUF model file or complete shard set, imported from Hugging Face
    or a PersistentVolumeClaim, verified and published into a ModelCache."""

    api_version: Literal["kama.dev/v1alpha1"] = "kama.dev/v1alpha1"
    kind: Literal["ModelArtifact"] = "ModelArtifact"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ModelArtifactSpec
    status: ModelArtifactStatus | None = None
