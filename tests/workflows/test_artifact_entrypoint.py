"""The activities of an artifact with several GGUF files (issue #26, item 5), on real
GGUF files: a model and its multimodal projector (``general.type mmproj``), a shard
set and a projector, two models.

Resolve picks the model among the names (``spec.entrypoint`` when given, never the
projector that sorts first); publish, and a Direct source's verification, read every
header and refuse an entrypoint that is a projector or a second model next to it,
record the projector, and take the GGUF facts from the model's files alone. No
Temporal server: each activity runs in ``ActivityEnvironment``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.cache import CacheActivities, gguf_facts
from activities.huggingface import HuggingFaceActivities
from activities.import_payloads import (
    DownloadedFile,
    HubSource,
    InPlaceRequest,
    PublishedArtifact,
    PublishRequest,
    PvcSource,
)
from activities.storage import hash_file
from activities.volume_source import PvcSourceActivities
from kama.cache_layout import READY_NAME, Manifest, staging_dir
from kamadev.gguf_factory import ModelShape, write_model, write_projector, write_shards
from kamadev.hub import HubFixture

MODEL = ModelShape(n_layer=3, n_head_kv=2, seed=1)
OTHER = ModelShape(n_layer=2, seed=2)
PROJECTOR = "mmproj-model-f16.gguf"  # sorts before model.gguf
OPERATION = "op-1"


def staged(cache: Path) -> Path:
    directory = cache / staging_dir(OPERATION) / "files"
    directory.mkdir(parents=True)
    return directory


def downloaded(directory: Path) -> list[DownloadedFile]:
    return [
        DownloadedFile(path=p.name, size=p.stat().st_size, sha256=hash_file(p))
        for p in sorted(directory.iterdir())
    ]


def publish(cache: Path, entrypoint: str) -> PublishedArtifact:
    directory = cache / staging_dir(OPERATION) / "files"
    request = PublishRequest(
        cache_root=str(cache),
        operation_id=OPERATION,
        files=downloaded(directory),
        entrypoint=entrypoint,
    )
    return ActivityEnvironment().run(CacheActivities().publish, request)


def refused(cache: Path, entrypoint: str) -> ApplicationError:
    with pytest.raises(ApplicationError) as info:
        publish(cache, entrypoint)
    assert info.value.type == "InvalidGGUF" and info.value.non_retryable
    assert not (cache / staging_dir(OPERATION)).exists(), "the staged bytes are discarded"
    return info.value


def model_facts(tmp_path: Path, shape: ModelShape) -> dict[str, object]:
    """The status facts of the model published alone."""
    alone = tmp_path / "alone"
    alone.mkdir()
    write_model(alone / "m.gguf", shape=shape)
    return gguf_facts(alone, downloaded(alone))


# ----- publish -------------------------------------------------------------------------


def test_a_model_and_its_projector_publish_as_one_artifact(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    files = staged(cache)
    write_model(files / "model.gguf", shape=MODEL)
    write_projector(files / PROJECTOR)

    artifact = publish(cache, "model.gguf")

    assert (artifact.entrypoint, artifact.projector) == ("model.gguf", PROJECTOR)
    assert artifact.facts == model_facts(tmp_path, MODEL), "the facts are the model's alone"
    assert artifact.facts["architecture"] == "llama" and artifact.facts["layers"] == 3
    blob = Path(artifact.directory)
    assert (blob / READY_NAME).exists()
    manifest = Manifest.parse((blob / "manifest.json").read_bytes())
    assert manifest.entrypoint == "model.gguf"
    assert sorted(f.path for f in manifest.files) == [PROJECTOR, "model.gguf"]


@pytest.mark.parametrize(
    ("general_type", "architecture", "why"),
    [
        ("mmproj", "clip", "general.type mmproj"),
        (None, "clip", "general.architecture clip"),
        ("mmproj", "llama", "general.type mmproj"),
    ],
    ids=["both", "architecture-only", "type-only"],
)
def test_a_projector_as_entrypoint_is_refused(
    tmp_path: Path, general_type: str | None, architecture: str, why: str
) -> None:
    cache = tmp_path / "cache"
    files = staged(cache)
    write_model(files / "model.gguf", shape=MODEL)
    write_projector(files / PROJECTOR, general_type=general_type, architecture=architecture)

    error = refused(cache, PROJECTOR)

    assert error.message == (
        f"{PROJECTOR} is a multimodal projector ({why}), not a model: "
        "set spec.entrypoint to the model file"
    )


def test_a_second_model_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    files = staged(cache)
    write_model(files / "model.gguf", shape=MODEL)
    write_model(files / "other.gguf", shape=OTHER)

    error = refused(cache, "model.gguf")

    assert "other.gguf is a second model" in error.message
    assert "an artifact holds one model" in error.message


def test_two_projectors_are_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    files = staged(cache)
    write_model(files / "model.gguf", shape=MODEL)
    write_projector(files / "mmproj-a.gguf")
    write_projector(files / "mmproj-b.gguf")

    error = refused(cache, "model.gguf")

    assert "2 multimodal projectors (mmproj-a.gguf, mmproj-b.gguf)" in error.message


def test_a_shard_set_and_its_projector_publish_as_one_artifact(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    files = staged(cache)
    shards = write_shards(files, stem="model", shape=MODEL, n_shards=2)
    write_projector(files / "mmproj.gguf")

    artifact = publish(cache, shards[0].name)

    assert (artifact.entrypoint, artifact.projector) == (shards[0].name, "mmproj.gguf")
    assert artifact.facts == model_facts(tmp_path, MODEL), "merged over the shards only"


def test_a_projector_without_its_model_is_no_artifact(tmp_path: Path) -> None:
    """A projector that does not call itself mmproj gets past the names, not the header."""
    cache = tmp_path / "cache"
    files = staged(cache)
    write_projector(files / "vision.gguf")

    error = refused(cache, "vision.gguf")

    assert "vision.gguf is a multimodal projector" in error.message


# ----- resolve (Hugging Face) ----------------------------------------------------------


def resolve_hub(
    hub: HubFixture, files: dict[str, Path], *, entrypoint: str | None = None
) -> tuple[str, list[str]]:
    hub.add_repo("acme/vl", files)
    activities = HuggingFaceActivities(http=None, endpoint=hub.url)  # type: ignore[arg-type]
    source = HubSource(repo="acme/vl", revision="main", files=sorted(files), entrypoint=entrypoint)
    resolved = ActivityEnvironment().run(activities.resolve_source, source)
    return resolved.entrypoint, [f.path for f in resolved.files]


def test_resolve_picks_the_model_not_the_projector_that_sorts_first(
    hub: HubFixture, tmp_path: Path
) -> None:
    model = write_model(tmp_path / "model.gguf", shape=MODEL)
    projector = write_projector(tmp_path / PROJECTOR)

    chosen, files = resolve_hub(hub, {"model.gguf": model, PROJECTOR: projector})

    assert chosen == "model.gguf" and files == [PROJECTOR, "model.gguf"]


def test_resolve_takes_spec_entrypoint_among_two_models(hub: HubFixture, tmp_path: Path) -> None:
    files = {
        "a.gguf": write_model(tmp_path / "a.gguf", shape=MODEL),
        "b.gguf": write_model(tmp_path / "b.gguf", shape=OTHER),
    }
    assert resolve_hub(hub, files, entrypoint="b.gguf")[0] == "b.gguf"


@pytest.mark.parametrize(
    ("entrypoint", "says"),
    [
        (None, "2 candidate model files (a.gguf, b.gguf)"),
        ("c.gguf", "spec.entrypoint 'c.gguf' is not one of a.gguf, b.gguf"),
    ],
    ids=["unset", "not-selected"],
)
def test_resolve_refuses_a_missing_or_wrong_spec_entrypoint(
    hub: HubFixture, tmp_path: Path, entrypoint: str | None, says: str
) -> None:
    files = {
        "a.gguf": write_model(tmp_path / "a.gguf", shape=MODEL),
        "b.gguf": write_model(tmp_path / "b.gguf", shape=OTHER),
    }
    with pytest.raises(ApplicationError) as info:
        resolve_hub(hub, files, entrypoint=entrypoint)
    assert info.value.type == "SourceUnavailable" and info.value.non_retryable
    assert says in info.value.message and "spec.entrypoint" in info.value.message


# ----- a claim's directory (Copy resolve, Direct verification) ------------------------


@pytest.fixture
def claim(tmp_path: Path) -> Path:
    root = tmp_path / "claim"
    (root / "models").mkdir(parents=True)
    write_model(root / "models" / "model.gguf", shape=MODEL)
    write_projector(root / "models" / PROJECTOR)
    return root


def test_a_claims_directory_with_a_projector_is_verified_in_place(claim: Path) -> None:
    activities = PvcSourceActivities()
    source = PvcSource(root=str(claim), path="models", direct=True)
    resolved = ActivityEnvironment().run(activities.resolve, source)
    assert resolved.entrypoint == "models/model.gguf"

    found = ActivityEnvironment().run(
        activities.verify_in_place,
        InPlaceRequest(source=source, files=resolved.files, entrypoint=resolved.entrypoint),
    )

    assert (found.entrypoint, found.projector, found.base_path) == (
        "model.gguf",
        PROJECTOR,
        "models",
    )
    assert found.facts["layers"] == 3


@pytest.mark.parametrize("entrypoint", ["other.gguf", "models/other.gguf"])
def test_a_claims_spec_entrypoint_is_a_name_in_the_directory(claim: Path, entrypoint: str) -> None:
    write_model(claim / "models" / "other.gguf", shape=OTHER)
    activities = PvcSourceActivities()
    unnamed = PvcSource(root=str(claim), path="models")
    with pytest.raises(ApplicationError, match=r"spec\.entrypoint") as info:
        ActivityEnvironment().run(activities.resolve, unnamed)
    assert info.value.type == "SourceUnavailable" and info.value.non_retryable

    named = PvcSource(root=str(claim), path="models", entrypoint=entrypoint)
    assert ActivityEnvironment().run(activities.resolve, named).entrypoint == "models/other.gguf"
