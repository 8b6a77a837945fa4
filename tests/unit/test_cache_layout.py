"""Manifest digests and cache paths: deterministic, canonical, and refusing escapes."""

from __future__ import annotations

import hashlib

import pytest

from kama.cache_layout import (
    InvalidPath,
    Manifest,
    ManifestFile,
    artifact_digest,
    blob_dir,
    safe_relative_path,
    staging_dir,
)

A = ManifestFile(path="model-00001-of-00002.gguf", size=10, sha256="a" * 64)
B = ManifestFile(path="model-00002-of-00002.gguf", size=20, sha256="b" * 64)


def test_manifest_digest_is_order_independent_and_canonical() -> None:
    one = Manifest.build(files=[B, A], entrypoint=A.path)
    two = Manifest.build(files=[A, B], entrypoint=A.path)
    assert one == two and one.digest == two.digest
    assert one.digest == hashlib.sha256(one.canonical_json()).hexdigest()
    assert Manifest.parse(one.canonical_json()) == one
    assert one.total_size == 30


def test_manifest_changes_with_any_byte_or_name() -> None:
    base = Manifest.build(files=[A], entrypoint=A.path).digest
    renamed = ManifestFile(path="other.gguf", size=10, sha256="a" * 64)
    assert Manifest.build(files=[renamed], entrypoint="other.gguf").digest != base
    resized = ManifestFile(path=A.path, size=11, sha256="a" * 64)
    assert Manifest.build(files=[resized], entrypoint=A.path).digest != base


def test_manifest_rejects_non_canonical_or_inconsistent_input() -> None:
    manifest = Manifest.build(files=[A], entrypoint=A.path)
    with pytest.raises(ValueError, match="canonical"):
        Manifest.parse(manifest.canonical_json().replace(b",", b", "))
    with pytest.raises(ValueError, match="entrypoint"):
        Manifest.build(files=[A], entrypoint="missing.gguf")
    with pytest.raises(ValueError, match="sorted"):
        Manifest(files=(B, A), entrypoint=A.path)
    with pytest.raises(ValueError, match="malformed"):
        Manifest.parse(b'{"schema": "kama.dev/manifest/v1"}')


@pytest.mark.parametrize(
    "path", ["../x.gguf", "/abs.gguf", "a/../b", "a//b", "./a", "", "a\\b", "dir/"]
)
def test_unsafe_paths_are_refused(path: str) -> None:
    with pytest.raises(InvalidPath):
        safe_relative_path(path)


def test_paths_and_digests() -> None:
    assert str(safe_relative_path("sub/dir/m.gguf")) == "sub/dir/m.gguf"
    assert str(blob_dir("c" * 64)) == f"blobs/sha256/{'c' * 64}"
    assert str(staging_dir("op-1")) == ".kama/staging/op-1"
    with pytest.raises(ValueError):
        staging_dir("../escape")
    with pytest.raises(ValueError):
        blob_dir("nothex")
    assert artifact_digest([A]) == A.sha256
    assert artifact_digest([B, A]) == artifact_digest([A, B]) != A.sha256
