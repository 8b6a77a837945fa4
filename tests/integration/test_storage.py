"""Downloads resume without refetching bytes, hashing happens while bytes arrive,
and publication into the content-addressed cache is atomic and deduplicated.
Runs against the local Hub fixture on loopback (no cluster needed)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from huggingface_hub import hf_hub_url

from activities.storage import (
    Download,
    SourceUnavailable,
    TransferInterrupted,
    download_resumable,
    hash_file,
    publish,
    published,
    staged_file,
)
from kama.cache_layout import READY_NAME, Manifest, ManifestFile, blob_dir, staging_dir
from kamadev.hub import Fault, HubFixture

MIB = 1 << 20


@pytest.fixture
def hub() -> Iterator[HubFixture]:
    fixture = HubFixture()
    fixture.start()
    yield fixture
    fixture.stop()


@pytest.fixture
def blob(tmp_path: Path) -> Path:
    path = tmp_path / "source.gguf"
    path.write_bytes(os.urandom(3 * MIB + 123))
    return path


def source(hub: HubFixture, blob: Path, repo: str = "acme/m") -> Download:
    commit = hub.add_repo(repo, {"m.gguf": blob})
    return Download(
        url=hf_hub_url(repo, "m.gguf", revision=commit, endpoint=hub.url),
        headers={},
        size=blob.stat().st_size,
    )


def test_download_resumes_after_truncation_without_refetching(
    hub: HubFixture, blob: Path, tmp_path: Path
) -> None:
    src = source(hub, blob)
    hub.inject("acme/m", "m.gguf", Fault(truncate_at=MIB))
    target = tmp_path / "staging" / "m.gguf"
    seen: list[int] = []
    with httpx.Client() as client:
        with pytest.raises(TransferInterrupted):
            download_resumable(client=client, source=src, target=target)
        assert target.stat().st_size == MIB
        digest = download_resumable(
            client=client, source=src, target=target, on_progress=seen.append
        )
    assert digest == hashlib.sha256(blob.read_bytes()).hexdigest()
    assert target.read_bytes() == blob.read_bytes()
    ranges = [(r.start, r.end) for r in hub.served_ranges("acme/m", "m.gguf")]
    assert ranges == [(0, MIB), (MIB, blob.stat().st_size)], "no byte is fetched twice"
    assert seen[0] == MIB and seen[-1] == blob.stat().st_size


def test_http_errors_are_typed(hub: HubFixture, blob: Path, tmp_path: Path) -> None:
    src = source(hub, blob)
    with httpx.Client() as client:
        hub.inject("acme/m", "m.gguf", Fault(status=401))
        with pytest.raises(SourceUnavailable, match="401"):
            download_resumable(client=client, source=src, target=tmp_path / "a")
        hub.inject("acme/m", "m.gguf", Fault(status=502))
        with pytest.raises(TransferInterrupted, match="502"):
            download_resumable(client=client, source=src, target=tmp_path / "a")
        hub.inject("acme/m", "m.gguf", Fault(corrupt=True))
        wrong = download_resumable(client=client, source=src, target=tmp_path / "b")
    assert wrong != hashlib.sha256(blob.read_bytes()).hexdigest()


def _stage(root: Path, operation: str, content: bytes) -> Manifest:
    path = staged_file(root=root, operation_id=operation, path="m.gguf")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    entry = ManifestFile(path="m.gguf", size=len(content), sha256=hash_file(path))
    return Manifest.build(files=[entry], entrypoint="m.gguf")


def test_publish_is_atomic_and_deduplicated(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    manifest = _stage(root, "op-1", b"GGUF-bytes")
    final = publish(root=root, operation_id="op-1", manifest=manifest)
    assert final == root / blob_dir(manifest.digest)
    assert (final / READY_NAME).read_text().strip() == manifest.digest
    assert published(root=root, digest=manifest.digest) == manifest
    assert not (root / staging_dir("op-1")).exists()

    again = _stage(root, "op-2", b"GGUF-bytes")
    assert publish(root=root, operation_id="op-2", manifest=again) == final
    assert not (root / staging_dir("op-2")).exists()
    assert sorted(p.name for p in (root / "blobs" / "sha256").iterdir()) == [manifest.digest]


def test_directory_without_ready_is_not_an_artifact_and_publish_completes_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cache"
    manifest = _stage(root, "op-1", b"GGUF-other")
    publish(root=root, operation_id="op-1", manifest=manifest)
    (root / blob_dir(manifest.digest) / READY_NAME).unlink()  # died between rename and READY
    assert published(root=root, digest=manifest.digest) is None
    publish(root=root, operation_id="op-1", manifest=manifest)
    assert published(root=root, digest=manifest.digest) == manifest
