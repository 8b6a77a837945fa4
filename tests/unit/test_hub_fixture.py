"""The local Hub fixture answers the real `huggingface_hub` client the way the Hub
does: repo info, revision resolution, file metadata, ranged downloads, errors."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

from kamadev.hub import Fault, HubFixture


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubFixture]:
    fixture = HubFixture()
    fixture.start()
    yield fixture
    fixture.stop()


def test_repo_info_metadata_and_download(hub: HubFixture, tmp_path: Path) -> None:
    blob = tmp_path / "model.gguf"
    blob.write_bytes(b"GGUF" + bytes(range(256)) * 100)
    commit = hub.add_repo("acme/tiny", {"model.gguf": blob})
    api = HfApi(endpoint=hub.url)
    info = api.model_info("acme/tiny", revision="main", files_metadata=True)
    assert info.sha == commit
    assert info.siblings is not None
    (sibling,) = info.siblings
    assert sibling.rfilename == "model.gguf" and sibling.size == blob.stat().st_size
    assert sibling.lfs is not None and len(sibling.lfs.sha256) == 64

    meta = get_hf_file_metadata(
        hf_hub_url("acme/tiny", "model.gguf", revision=commit, endpoint=hub.url)
    )
    assert (
        meta.commit_hash == commit
        and meta.size == blob.stat().st_size
        and meta.etag == sibling.lfs.sha256
    )

    path = hf_hub_download(
        "acme/tiny", "model.gguf", revision=commit, endpoint=hub.url, cache_dir=tmp_path / "cache"
    )
    assert Path(path).read_bytes() == blob.read_bytes()

    url = hf_hub_url("acme/tiny", "model.gguf", revision=commit, endpoint=hub.url)
    partial = httpx.get(url, headers={"Range": "bytes=4-9"})
    assert partial.status_code == 206 and partial.content == blob.read_bytes()[4:10]

    # the server records a range after its last byte is sent, so the whole download's
    # record may land after the partial's, and the partial's after the client has its
    # bytes: which ranges, not their order, and within a moment
    def served() -> list[tuple[int, int]]:
        return [(r.start, r.end) for r in hub.served_ranges("acme/tiny", "model.gguf")]

    deadline = time.monotonic() + 5
    while (4, 10) not in served() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (4, 10) in served()


def test_errors_map_to_huggingface_hub_exceptions(hub: HubFixture, tmp_path: Path) -> None:
    blob = tmp_path / "m.gguf"
    blob.write_bytes(b"GGUF")
    hub.add_repo("acme/private", {"m.gguf": blob}, token="hf_secret")
    api = HfApi(endpoint=hub.url)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("acme/missing")
    with pytest.raises(HfHubHTTPError) as unauthorized:
        api.model_info("acme/private", token=False)
    assert unauthorized.value.response.status_code == 401
    assert api.model_info("acme/private", token="hf_secret").sha
    with pytest.raises(RevisionNotFoundError):
        api.model_info("acme/private", revision="nope", token="hf_secret")

    hub.inject("acme/private", "m.gguf", Fault(status=503, times=1))
    url = hf_hub_url("acme/private", "m.gguf", endpoint=hub.url)
    headers = {"Authorization": "Bearer hf_secret"}
    assert httpx.get(url, headers=headers).status_code == 503
    assert httpx.get(url, headers=headers).content == b"GGUF"
