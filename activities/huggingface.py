"""Hugging Face as an external system: resolve a revision to a commit and a file
list through the real `huggingface_hub` client, and download files into the
cache's staging area (resumable, hashed while they arrive, progress as heartbeats).

Errors that retrying cannot fix (missing repo, revision or file; 401/403) are
non-retryable `SourceUnavailable`; 5xx and broken transfers retry and resume. The
token is read from a file at call time and never logged or returned.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils._headers import build_hf_headers
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.import_payloads import (
    DownloadedFile,
    DownloadRequest,
    HubSource,
    ResolvedFile,
    ResolvedSource,
)
from activities.storage import (
    Download,
    SourceUnavailable,
    TransferInterrupted,
    download_resumable,
    staged_file,
)
from kama.cache_layout import InvalidPath
from kama.gguf.shards import MissingShard
from kama.importer_pod import TOKEN_MOUNT
from kama.reasons import Failure
from kama.sources import FileSelectionError, SourceFile, entrypoint, select_files

HEARTBEAT_EVERY_S = 1.0
MAX_TOKEN_CHARS = 4096  # a Hub token is ~40 characters; a mounted file is not trusted further


def _token(source: HubSource, *, path: Path) -> str | bool:
    """The mounted token, when the source uses one (read from the importer's own
    mount, so an input cannot make it send another file)."""
    if not source.use_token:
        return False
    return path.read_text(encoding="utf-8").strip()[:MAX_TOKEN_CHARS]


def _unavailable(message: str) -> ApplicationError:
    return ApplicationError(message, type=Failure.SOURCE_UNAVAILABLE, non_retryable=True)


class HuggingFaceActivities:
    def __init__(
        self,
        *,
        http: httpx.Client,
        endpoint: str = "https://huggingface.co",
        token_path: Path = Path(TOKEN_MOUNT) / "token",
    ) -> None:
        self.http = http
        self.endpoint = endpoint
        self.token_path = token_path

    @activity.defn(name="Resolve Hugging Face source")
    def resolve_source(self, source: HubSource) -> ResolvedSource:
        api = HfApi(endpoint=self.endpoint)
        try:
            info = api.model_info(
                source.repo,
                revision=source.revision,
                files_metadata=True,
                token=_token(source, path=self.token_path),
            )
        except (RepositoryNotFoundError, GatedRepoError) as exc:
            raise _unavailable(
                f"repository {source.repo} not found or not accessible (HTTP {exc.response.status_code})"
            ) from None
        except RevisionNotFoundError:
            raise _unavailable(f"revision {source.revision!r} not found in {source.repo}") from None
        except HfHubHTTPError as exc:
            code = exc.response.status_code
            if code in (401, 403, 404):
                raise _unavailable(f"{source.repo}: HTTP {code}") from None
            raise  # 5xx and the like: retried
        if not info.sha:
            raise _unavailable(
                f"{source.repo}@{source.revision}: the source did not resolve a commit"
            )
        available = [
            SourceFile(
                path=s.rfilename, size=int(s.size or 0), sha256=s.lfs.sha256 if s.lfs else None
            )
            for s in info.siblings or []
        ]
        try:
            chosen = select_files(requested=source.files, available=available)
            model = entrypoint(chosen, requested=source.entrypoint)
        except MissingShard as exc:
            raise ApplicationError(
                str(exc), type=Failure.MISSING_SHARD, non_retryable=True
            ) from None
        except FileSelectionError as exc:
            raise _unavailable(str(exc)) from None
        return ResolvedSource(
            commit=info.sha,
            files=[ResolvedFile(path=f.path, size=f.size, sha256=f.sha256) for f in chosen],
            entrypoint=model,
        )

    @activity.defn(name="Download file into cache staging")
    def download_file(self, request: DownloadRequest) -> DownloadedFile:
        source = request.source
        url = hf_hub_url(
            source.repo, request.file.path, revision=request.commit, endpoint=self.endpoint
        )
        headers = build_hf_headers(token=_token(source, path=self.token_path), library_name="kama")
        headers["Accept-Encoding"] = "identity"
        try:
            target = staged_file(
                root=Path(request.cache_root),
                operation_id=request.operation_id,
                path=request.file.path,
            )
        except InvalidPath as exc:  # resolve refuses these; a retry could not fix one either
            raise _unavailable(str(exc)) from None
        last_beat = 0.0

        def progress(done: int) -> None:
            nonlocal last_beat
            now = time.monotonic()
            if now - last_beat >= HEARTBEAT_EVERY_S or done == request.file.size:
                activity.heartbeat(done)
                last_beat = now

        try:
            digest = download_resumable(
                client=self.http,
                source=Download(url=url, headers=headers, size=request.file.size),
                target=target,
                on_progress=progress,
            )
        except SourceUnavailable as exc:
            raise _unavailable(str(exc)) from None
        except TransferInterrupted as exc:
            raise ApplicationError(str(exc), type=Failure.TRANSFER_INTERRUPTED) from None
        return DownloadedFile(path=request.file.path, size=request.file.size, sha256=digest)
