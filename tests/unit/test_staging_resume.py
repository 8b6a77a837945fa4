"""The cache volume's staging, as an import's retry meets it (issue 12, item 13): a
partial file is resumed only from the origin it was started from, abandoned staging
is removed before free space is measured (this import's own partial bytes count as
free), a re-hash that fails quarantines the blob so that the next import downloads it
again, and spec.expectedSHA256 names a shard set's artifact digest. No network: the
source is an httpx MockTransport or a directory."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.cache import CacheActivities, StagingRequest
from activities.import_payloads import (
    CopyRequest,
    LookupRequest,
    PvcSource,
    ResolvedFile,
    VerifyPublishedRequest,
)
from activities.storage import (
    Download,
    TransferInterrupted,
    download_resumable,
    hash_file,
    origin_marker,
    publish,
    published,
    resume_partial,
    staged_file,
)
from activities.volume_source import PvcSourceActivities
from kama.cache_layout import (
    READY_NAME,
    Manifest,
    ManifestFile,
    artifact_digest,
    blob_dir,
    expected_digest_mismatch,
    staging_dir,
)

MIB = 1 << 20
DAY_S = 24 * 3600


class Served(NamedTuple):
    url: str
    start: int


def file_server(
    files: dict[str, bytes], log: list[Served], *, cut_at: int | None = None
) -> Callable[[httpx.Request], httpx.Response]:
    """A source that serves `files` by URL path, honours `Range`, and (with `cut_at`)
    sends only the bytes before that offset, as a broken connection would."""

    def handle(request: httpx.Request) -> httpx.Response:
        data = files[request.url.path]
        start = int(request.headers.get("Range", "bytes=0-")[6:].rstrip("-"))
        log.append(Served(request.url.path, start))
        body = data[start : cut_at if cut_at is not None and cut_at > start else None]
        return httpx.Response(206 if start else 200, stream=httpx.ByteStream(body))

    return handle


def download(files: dict[str, bytes], log: list[Served], url: str, target: Path, **cut: Any) -> str:
    with httpx.Client(transport=httpx.MockTransport(file_server(files, log, **cut))) as client:
        return download_resumable(
            client=client,
            source=Download(url=f"http://hub{url}", headers={}, size=len(files[url])),
            target=target,
        )


def test_a_partial_download_resumes_only_from_the_same_url(tmp_path: Path) -> None:
    old, new = os.urandom(2 * MIB), os.urandom(2 * MIB)
    files = {"/acme/m/resolve/c1/m.gguf": old, "/acme/m/resolve/c2/m.gguf": new}
    target = tmp_path / "staging" / "m.gguf"
    log: list[Served] = []
    with pytest.raises(TransferInterrupted):
        download(files, log, "/acme/m/resolve/c1/m.gguf", target, cut_at=MIB)
    assert target.stat().st_size == MIB and origin_marker(target).exists()

    # the branch moved: the same file name at another commit starts from zero
    digest = download(files, log, "/acme/m/resolve/c2/m.gguf", target)
    assert digest == hashlib.sha256(new).hexdigest() and target.read_bytes() == new
    assert log[-1] == Served("/acme/m/resolve/c2/m.gguf", 0)

    # the same commit resumes after the bytes it has
    target.write_bytes(new[:MIB])
    assert download(files, log, "/acme/m/resolve/c2/m.gguf", target) == digest
    assert log[-1] == Served("/acme/m/resolve/c2/m.gguf", MIB)


def test_a_transfer_that_failed_before_its_first_byte_starts_again(tmp_path: Path) -> None:
    """The marker is written before the first byte, and a 503 may come before it."""
    target = tmp_path / "staging" / "m.gguf"
    assert resume_partial(target=target, origin="u 10", size=10)[0] == 0
    assert origin_marker(target).exists() and not target.exists()
    offset, digest = resume_partial(target=target, origin="u 10", size=10)
    assert offset == 0 and digest.hexdigest() == hashlib.sha256().hexdigest()


def copy(root: Path, staging: str, source: PvcSource, size: int) -> str:
    request = CopyRequest(
        source=source,
        file=ResolvedFile(path="models/m.gguf", size=size, sha256=None),
        cache_root=str(root / "cache"),
        operation_id=staging,
    )
    return ActivityEnvironment().run(PvcSourceActivities().copy_file, request).sha256


def test_a_partial_copy_restarts_when_the_source_file_changed(tmp_path: Path) -> None:
    """Resuming a copy of a file rewritten since would publish half of each."""
    claim = tmp_path / "claim"
    (claim / "models").mkdir(parents=True)
    source = PvcSource(root=str(claim), path="models/m.gguf")
    first, second = os.urandom(MIB), os.urandom(MIB)
    (claim / "models" / "m.gguf").write_bytes(first)
    assert copy(tmp_path, "artifact-1", source, MIB) == hashlib.sha256(first).hexdigest()
    staged = staged_file(root=tmp_path / "cache", operation_id="artifact-1", path="m.gguf")
    with staged.open("r+b") as f:
        f.truncate(MIB // 2)  # an attempt that stopped half way

    (claim / "models" / "m.gguf").write_bytes(second)  # then someone replaced the file
    assert copy(tmp_path, "artifact-1", source, MIB) == hashlib.sha256(second).hexdigest()
    assert staged.read_bytes() == second

    with staged.open("r+b") as f:
        f.truncate(MIB // 2)  # unchanged source: the copy resumes
    assert copy(tmp_path, "artifact-1", source, MIB) == hashlib.sha256(second).hexdigest()


def stage(root: Path, staging: str, content: bytes, *, age_s: float = 0) -> Path:
    path = staged_file(root=root, operation_id=staging, path="m.gguf")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    then = time.time() - age_s
    for entry in [path, *path.parents][:4]:
        os.utime(entry, (then, then))
    return path


def prepare(root: Path, staging: str, needed: int) -> int:
    request = StagingRequest(cache_root=str(root), staging_id=staging, needed_bytes=needed)
    return ActivityEnvironment().run(CacheActivities().prepare_staging, request)


def test_prepare_removes_abandoned_staging_and_counts_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage(tmp_path, "abandoned", b"x" * 100, age_s=2 * DAY_S)
    stage(tmp_path, "busy", b"y" * 100)  # another import, under way
    own = stage(tmp_path, "artifact-1", b"z" * 400, age_s=3 * DAY_S)  # ours, to resume
    origin_marker(own).write_text("http://hub/m.gguf 1000")

    class Usage(NamedTuple):
        total: int
        used: int
        free: int

    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(10_000, 9_400, 600))
    assert prepare(tmp_path, "artifact-1", 1000) == 1000, "free + its own 400 staged bytes"
    staging = tmp_path / staging_dir("x").parent
    assert sorted(p.name for p in staging.iterdir()) == ["artifact-1", "busy"]

    with pytest.raises(ApplicationError) as refused:
        prepare(tmp_path, "artifact-1", 1001)
    assert refused.value.type == "InsufficientStorage" and refused.value.non_retryable
    assert refused.value.details == ({"freeBytes": 1000, "neededBytes": 1001},)


def publish_bytes(root: Path, content: bytes) -> Manifest:
    path = stage(root, "op-1", content)
    origin_marker(path).write_text("origin")
    entry = ManifestFile(path="m.gguf", size=len(content), sha256=hash_file(path))
    manifest = Manifest.build(files=[entry], entrypoint="m.gguf")
    publish(root=root, operation_id="op-1", manifest=manifest)
    return manifest


def test_publish_leaves_no_origin_marker_in_the_blob(tmp_path: Path) -> None:
    manifest = publish_bytes(tmp_path, b"GGUF-bytes")
    blob = tmp_path / blob_dir(manifest.digest)
    assert sorted(p.name for p in blob.iterdir()) == [READY_NAME, "m.gguf", "manifest.json"]


def test_a_failed_rehash_quarantines_the_blob_so_it_is_imported_again(tmp_path: Path) -> None:
    manifest = publish_bytes(tmp_path, b"GGUF-other")
    cache = CacheActivities()
    request = VerifyPublishedRequest(cache_root=str(tmp_path), manifest_digest=manifest.digest)
    assert ActivityEnvironment().run(cache.verify_published, request) == manifest.total_size

    (tmp_path / blob_dir(manifest.digest) / "m.gguf").write_bytes(b"GGUF-OTHER")  # same size
    with pytest.raises(ApplicationError) as failed:
        ActivityEnvironment().run(cache.verify_published, request)
    assert failed.value.type == "ChecksumMismatch" and "quarantine" in failed.value.message
    assert published(root=tmp_path, digest=manifest.digest) is None
    lookup = LookupRequest(cache_root=str(tmp_path), manifest_digest=manifest.digest)
    assert not ActivityEnvironment().run(cache.lookup, lookup), "the next import downloads"


def test_expected_sha256_is_the_file_or_the_shard_sets_artifact_digest() -> None:
    one = [ManifestFile(path="m.gguf", size=1, sha256="a" * 64)]
    assert expected_digest_mismatch(expected="a" * 64, files=one) is None
    assert "m.gguf: sha256" in (expected_digest_mismatch(expected="b" * 64, files=one) or "")
    shards = [
        ManifestFile(path=f"m-0000{i}-of-00002.gguf", size=i, sha256=f"{i}" * 64) for i in (1, 2)
    ]
    digest = artifact_digest(shards)
    assert expected_digest_mismatch(expected=digest, files=shards) is None
    assert expected_digest_mismatch(expected=None, files=shards) is None
    wrong = expected_digest_mismatch(expected="1" * 64, files=shards)
    assert wrong is not None and "artifact digest of 2 files" in wrong and digest in wrong
