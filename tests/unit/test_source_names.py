"""File names a source may not give an artifact.

A source's file names become paths in the cache: under the staging area while they
download, then inside the published blob next to Kama's own ``manifest.json`` and
``READY``. A name that leaves the directory (``../evil.gguf``) or that Kama writes
itself must be refused when the source is resolved, as a non-retryable
``SourceUnavailable`` naming the file, not discovered later by a download that
retries forever or by a publish that overwrites the model's own file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.huggingface import HuggingFaceActivities
from activities.import_payloads import DownloadRequest, HubSource, PvcSource, ResolvedFile
from activities.volume_source import PvcSourceActivities
from kama.cache_layout import MANIFEST_NAME, READY_NAME
from kama.sources import FileSelectionError, SourceFile, select_files
from kamadev.hub import HubFixture


@pytest.fixture
def hub() -> Iterator[HubFixture]:
    fixture = HubFixture()
    fixture.start()
    yield fixture
    fixture.stop()


def _listing(*paths: str) -> list[SourceFile]:
    return [SourceFile(path=p, size=1, sha256=None) for p in paths]


@pytest.mark.parametrize(
    ("requested", "listed", "refused"),
    [
        ([READY_NAME], [READY_NAME, "m.gguf"], READY_NAME),
        ([MANIFEST_NAME], [MANIFEST_NAME], MANIFEST_NAME),
        (["m.gguf", "sub/READY"], ["m.gguf", "sub/READY"], "sub/READY"),
        (["../evil.gguf"], ["../evil.gguf"], "../evil.gguf"),
        (["/abs.gguf"], ["/abs.gguf"], "/abs.gguf"),
        (["a//b.gguf"], ["a//b.gguf"], "a//b.gguf"),
        (["a\\b.gguf"], ["a\\b.gguf"], "a\\b.gguf"),
        (
            ["*evil-*-of-00002.gguf"],
            ["../evil-00001-of-00002.gguf", "../evil-00002-of-00002.gguf"],
            "../evil-00001-of-00002.gguf",
        ),
    ],
    ids=[
        "ready",
        "manifest",
        "nested-ready",
        "dotdot",
        "absolute",
        "empty-part",
        "backslash",
        "glob",
    ],
)
def test_unsafe_and_reserved_names_are_refused(
    requested: list[str], listed: list[str], refused: str
) -> None:
    with pytest.raises(FileSelectionError, match=re.escape(repr(refused))):
        select_files(requested=requested, available=_listing(*listed))


def test_unselected_odd_names_in_the_listing_do_not_matter() -> None:
    listing = _listing("m.gguf", READY_NAME, "../evil.gguf", MANIFEST_NAME)
    assert [f.path for f in select_files(requested=["m.gguf"], available=listing)] == ["m.gguf"]
    nested = _listing("q4/m.gguf")
    assert [f.path for f in select_files(requested=["q4/m.gguf"], available=nested)] == [
        "q4/m.gguf"
    ]


def _resolve_hub(hub: HubFixture, tmp_path: Path, names: list[str], files: list[str]) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(b"GGUF" + b"\0" * 60)
    hub.add_repo("acme/odd", dict.fromkeys(names, blob))
    activities = HuggingFaceActivities(http=None, endpoint=hub.url)  # type: ignore[arg-type]
    source = HubSource(repo="acme/odd", revision="main", files=files)
    ActivityEnvironment().run(activities.resolve_source, source)


@pytest.mark.parametrize(
    ("names", "files", "refused"),
    [
        (["m.gguf", READY_NAME], ["m.gguf", READY_NAME], READY_NAME),
        (["m.gguf", MANIFEST_NAME], ["m.gguf", MANIFEST_NAME], MANIFEST_NAME),
        (
            ["../evil-00001-of-00002.gguf", "../evil-00002-of-00002.gguf"],
            ["*-of-00002.gguf"],
            "../evil-00001-of-00002.gguf",
        ),
    ],
    ids=["ready", "manifest", "glob-dotdot"],
)
def test_hub_resolve_refuses_them_as_source_unavailable(
    hub: HubFixture, tmp_path: Path, names: list[str], files: list[str], refused: str
) -> None:
    with pytest.raises(ApplicationError) as info:
        _resolve_hub(hub, tmp_path, names, files)
    assert info.value.type == "SourceUnavailable" and info.value.non_retryable
    assert repr(refused) in str(info.value)


def test_hub_resolve_still_accepts_plain_names(hub: HubFixture, tmp_path: Path) -> None:
    _resolve_hub(hub, tmp_path, ["m.gguf", "README.md"], ["m.gguf"])


@pytest.mark.parametrize("name", [READY_NAME, MANIFEST_NAME])
def test_volume_resolve_refuses_reserved_names(tmp_path: Path, name: str) -> None:
    """A claim's files are copied into the cache under their base names."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / name).write_bytes(b"GGUF")
    source = PvcSource(root=str(tmp_path), path=f"models/{name}")
    with pytest.raises(ApplicationError) as info:
        ActivityEnvironment().run(PvcSourceActivities().resolve, source)
    assert info.value.type == "SourceUnavailable" and info.value.non_retryable
    assert name in str(info.value)


def test_download_of_an_unsafe_name_is_not_retried(tmp_path: Path) -> None:
    """Resolve refuses such names; a workflow resolved before that still must not retry."""
    request = DownloadRequest(
        source=HubSource(repo="acme/odd", revision="main", files=["*.gguf"]),
        commit="0" * 40,
        file=ResolvedFile(path="../evil.gguf", size=4, sha256=None),
        cache_root=str(tmp_path),
        operation_id="op-1",
    )
    activities = HuggingFaceActivities(http=None, endpoint="http://127.0.0.1:9")  # type: ignore[arg-type]
    with pytest.raises(ApplicationError) as info:
        ActivityEnvironment().run(activities.download_file, request)
    assert info.value.type == "SourceUnavailable" and info.value.non_retryable
    assert "../evil.gguf" in str(info.value)
