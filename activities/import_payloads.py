"""What the import activities (Hub, claim source, cache) take and return, and the
`status` answer of an import, which the progress activity reads: dataclasses, so
Temporal's default converter carries them and fields can be added later. Their field
names are in recorded workflow histories: add fields with defaults, never rename one.
Secrets never appear here: a token is referenced by a file path that only the
importer can read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kama.contracts import WorkflowStatus


@dataclass(frozen=True)
class HubSource:
    """The files of a Hugging Face repository one import fetches, as the workflow
    resolved them from the artifact's `spec.source.huggingFace` (the API's
    `kama.api.artifact.HuggingFaceSource`): whether to send a token instead of which
    Secret holds it, and the entrypoint the spec names beside the source."""

    repo: str
    revision: str
    files: list[str]
    # send the token the importer pod has mounted (the artifact's tokenSecretRef); the
    # Hub endpoint and the token's path are the importer's own settings, never an input
    use_token: bool = False
    # spec.entrypoint: the model among `files` (a path in the repository); None = the
    # only candidate (a default, so histories recorded before the field still decode)
    entrypoint: str | None = None


@dataclass(frozen=True)
class ResolvedFile:
    path: str
    size: int
    sha256: str | None


@dataclass(frozen=True)
class ResolvedSource:
    commit: str
    files: list[ResolvedFile]
    entrypoint: str

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class DownloadRequest:
    source: HubSource
    commit: str
    file: ResolvedFile
    cache_root: str
    operation_id: str


@dataclass(frozen=True)
class DownloadedFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class SpaceRequest:
    cache_root: str
    needed_bytes: int


@dataclass(frozen=True)
class PublishRequest:
    cache_root: str
    operation_id: str
    files: list[DownloadedFile]
    entrypoint: str


@dataclass(frozen=True)
class PublishedArtifact:
    manifest_digest: str
    artifact_digest: str
    total_size: int
    directory: str
    facts: dict[str, Any] = field(default_factory=dict)  # of the entrypoint's file(s) only
    # the model llama-server serves and the multimodal projector next to it, if any
    # (paths relative to `directory`; defaults so that older histories still decode)
    entrypoint: str = ""
    projector: str | None = None


@dataclass(frozen=True)
class LookupRequest:
    cache_root: str
    manifest_digest: str


@dataclass(frozen=True)
class DiscardRequest:
    cache_root: str
    operation_id: str


@dataclass(frozen=True)
class PvcSource:
    """A file (or a directory of shards) on a claim mounted read-only at `root`."""

    root: str
    path: str
    direct: bool = False
    # spec.entrypoint: the model's file name in the directory at `path` (or its path
    # from the claim's root); None = the only candidate
    entrypoint: str | None = None


@dataclass(frozen=True)
class CopyRequest:
    source: PvcSource
    file: ResolvedFile
    cache_root: str
    operation_id: str


@dataclass(frozen=True)
class InPlaceRequest:
    source: PvcSource
    files: list[ResolvedFile]
    entrypoint: str


@dataclass(frozen=True)
class InPlaceArtifact:
    files: list[DownloadedFile]
    manifest_digest: str
    artifact_digest: str
    total_size: int
    base_path: str  # directory of the files, relative to the claim root
    facts: dict[str, Any] = field(default_factory=dict)
    entrypoint: str = ""  # file name in `base_path`, as in PublishedArtifact
    projector: str | None = None


@dataclass
class ImportStatus(WorkflowStatus):
    """The `status` answer of an ImportWorkflow: how far the download has come."""

    commit: str | None = None
    files_done: int = 0
    files_total: int = 0
    bytes_total: int = 0
    bytes_completed: int = 0  # bytes of the files already downloaded
    reused: bool = False
    files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class VerifyPublishedRequest:
    cache_root: str
    manifest_digest: str
