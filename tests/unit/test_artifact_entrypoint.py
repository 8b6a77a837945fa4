"""Which file of an artifact is the model (issue #26, item 5).

An artifact may hold more than one GGUF file: a model and its multimodal projector
(``mmproj-*.gguf``), or a shard set and a projector. The file llama-server serves must
then be the model, never the projector that sorts first, and an artifact with two
candidate models must say which one it means (``spec.entrypoint``) instead of Kama
guessing. Pure: the source's file selection, the resolve-time choice of the entrypoint,
the planner's reading of an artifact's status, and the API field.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kama.api import ArtifactFile, ModelArtifactSpec, ModelArtifactStatus
from kama.api.artifact import ARTIFACT_SPEC_RULES, ENTRYPOINT_IMMUTABLE_RULE
from kama.deployment_plan import ArtifactNotUsable, entrypoint_of
from kama.gguf.shards import MissingShard
from kama.sources import FileSelectionError, SourceFile, entrypoint, select_files

SHA = "0" * 64
SHARDS = ["model-00001-of-00002.gguf", "model-00002-of-00002.gguf"]


def _listing(*paths: str) -> list[SourceFile]:
    return [SourceFile(path=p, size=1, sha256=None) for p in paths]


def _chosen(*paths: str) -> list[SourceFile]:
    return select_files(requested=list(paths), available=_listing(*paths))


# ----- the resolve-time choice --------------------------------------------------------


def test_an_empty_selection_has_no_model_instead_of_an_index_error() -> None:
    with pytest.raises(FileSelectionError, match="no model file"):
        entrypoint([], requested=None)


def test_a_single_file_is_the_model() -> None:
    assert entrypoint(_chosen("q4/m.gguf"), requested=None) == "q4/m.gguf"


def test_the_projector_that_sorts_first_is_not_the_model() -> None:
    """``mmproj-model-f16.gguf`` sorts before ``model.gguf``; the model is still the model."""
    files = _chosen("model.gguf", "mmproj-model-f16.gguf")
    assert entrypoint(files, requested=None) == "model.gguf"


def test_a_projector_is_recognised_by_name_whatever_the_case() -> None:
    files = _chosen("a-MMProj-F16.gguf", "b.gguf")
    assert entrypoint(files, requested=None) == "b.gguf"


def test_a_shard_set_and_a_projector_form_one_artifact() -> None:
    files = _chosen(*SHARDS, "mmproj.gguf")
    assert [f.path for f in files] == ["mmproj.gguf", *SHARDS]
    assert entrypoint(files, requested=None) == SHARDS[0]


def test_a_projector_alone_is_no_model() -> None:
    with pytest.raises(FileSelectionError, match=r"no model file among mmproj-f16\.gguf"):
        entrypoint(_chosen("mmproj-f16.gguf"), requested=None)


def test_files_that_are_not_gguf_are_no_model() -> None:
    with pytest.raises(FileSelectionError, match=r"no model file among README\.md"):
        entrypoint(_chosen("README.md"), requested=None)


@pytest.mark.parametrize(
    "paths",
    [["a.gguf", "b.gguf"], [*SHARDS, "other.gguf"]],
    ids=["two-files", "shard-set-and-file"],
)
def test_two_candidate_models_need_spec_entrypoint(paths: list[str]) -> None:
    with pytest.raises(FileSelectionError, match=r"spec\.entrypoint") as info:
        entrypoint(_chosen(*paths), requested=None)
    first = paths[0]
    assert first in str(info.value) and paths[-1] in str(info.value)


def test_a_long_list_of_candidates_is_cut_short_in_the_message() -> None:
    names = [f"m{i:02d}.gguf" for i in range(20)]
    with pytest.raises(FileSelectionError, match="20 candidate model files") as info:
        entrypoint(_chosen(*names), requested=None)
    assert "m07.gguf and 12 more" in str(info.value) and "m08.gguf" not in str(info.value)


def test_spec_entrypoint_chooses_among_candidates() -> None:
    assert entrypoint(_chosen("a.gguf", "b.gguf"), requested="b.gguf") == "b.gguf"
    files = _chosen(*SHARDS, "other.gguf")
    assert entrypoint(files, requested=SHARDS[0]) == SHARDS[0]
    assert entrypoint(files, requested="other.gguf") == "other.gguf"


def test_spec_entrypoint_must_be_a_selected_file() -> None:
    with pytest.raises(FileSelectionError, match=r"spec\.entrypoint 'c\.gguf' is not one of"):
        entrypoint(_chosen("a.gguf", "b.gguf"), requested="c.gguf")


def test_spec_entrypoint_must_name_the_first_shard() -> None:
    with pytest.raises(FileSelectionError, match=r"spec\.entrypoint.*first shard") as info:
        entrypoint(_chosen(*SHARDS), requested=SHARDS[1])
    assert SHARDS[0] in str(info.value)


def test_spec_entrypoint_must_be_a_gguf_file() -> None:
    with pytest.raises(FileSelectionError, match=r"spec\.entrypoint.*\.gguf"):
        entrypoint(_chosen("a.gguf", "README.md"), requested="README.md")


# ----- the selection -----------------------------------------------------------------


def test_two_shard_sets_are_still_refused() -> None:
    other = ["other-00001-of-00002.gguf", "other-00002-of-00002.gguf"]
    with pytest.raises(FileSelectionError, match="2 different shard sets"):
        _chosen(*SHARDS, *other, "mmproj.gguf")


def test_an_incomplete_shard_set_is_still_refused_next_to_a_plain_file() -> None:
    with pytest.raises(MissingShard, match="00002-of-00002"):
        _chosen(SHARDS[0], "mmproj.gguf")


# ----- what the planner serves -------------------------------------------------------


def _status(*paths: str, **fields: str) -> ModelArtifactStatus:
    files = [ArtifactFile(path=p, size=1, sha256=SHA) for p in paths]
    return ModelArtifactStatus(files=files, **fields)


def test_the_status_entrypoint_is_served() -> None:
    status = _status("mmproj.gguf", "model.gguf", entrypoint="model.gguf", projector="mmproj.gguf")
    assert entrypoint_of(status) == "model.gguf"


def test_a_status_without_entrypoint_serves_its_only_model() -> None:
    assert entrypoint_of(_status("README.md", "m.gguf")) == "m.gguf"
    assert entrypoint_of(_status(*reversed(SHARDS))) == SHARDS[0]


@pytest.mark.parametrize(
    ("paths", "why"),
    [
        (["mmproj-model-f16.gguf", "model.gguf"], "2 .gguf files"),
        ([*SHARDS, "mmproj.gguf"], "3 .gguf files"),
        (["README.md"], "no .gguf file"),
    ],
    ids=["model-and-projector", "shards-and-projector", "none"],
)
def test_a_status_without_entrypoint_and_several_files_is_not_guessed(
    paths: list[str], why: str
) -> None:
    with pytest.raises(ArtifactNotUsable, match=why):
        entrypoint_of(_status(*paths))


# ----- the API field -------------------------------------------------------------------


def _spec(**extra: object) -> ModelArtifactSpec:
    return ModelArtifactSpec.model_validate(
        {
            "source": {"huggingFace": {"repo": "acme/vl", "files": ["model.gguf", "mmproj.gguf"]}},
            "cacheRef": {"name": "models"},
            **extra,
        }
    )


def test_spec_entrypoint_round_trips_in_camel_case() -> None:
    spec = _spec(entrypoint="model.gguf")
    assert spec.entrypoint == "model.gguf"
    assert spec.model_dump(by_alias=True, exclude_none=True)["entrypoint"] == "model.gguf"
    assert _spec().entrypoint is None


@pytest.mark.parametrize("bad", ["/abs.gguf", "../m.gguf", "a\\b.gguf", "", "x" * 1025])
def test_spec_entrypoint_must_be_a_relative_path(bad: str) -> None:
    with pytest.raises(ValidationError):
        _spec(entrypoint=bad)


def test_spec_entrypoint_is_immutable_once_set() -> None:
    assert ENTRYPOINT_IMMUTABLE_RULE in ARTIFACT_SPEC_RULES
    assert "oldSelf.entrypoint" in ENTRYPOINT_IMMUTABLE_RULE.rule
    assert ENTRYPOINT_IMMUTABLE_RULE.message == "spec.entrypoint is immutable once set"


def test_status_names_the_model_and_its_projector() -> None:
    status = ModelArtifactStatus.model_validate(
        {"entrypoint": "model.gguf", "projector": "mmproj.gguf"}
    )
    assert (status.entrypoint, status.projector) == ("model.gguf", "mmproj.gguf")
    dumped = status.model_dump(by_alias=True, exclude_none=True)
    assert dumped["entrypoint"] == "model.gguf" and dumped["projector"] == "mmproj.gguf"
