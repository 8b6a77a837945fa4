"""What the runtime supervisor checks before it serves a Direct artifact (issue 12,
item 14): the claim holds no manifest and no READY, so the files are hashed again and
the manifest the import built is rebuilt from them; its digest must be the one the
import recorded (the serving plan's). Changed bytes, a missing shard and a symlink
out of /models are refused; a published cache blob is still checked by its READY
and manifest. The pod tells the supervisor which layout it mounts."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.import_payloads import InPlaceRequest, PvcSource
from activities.volume_source import PvcSourceActivities
from kama.serving_plan import ARTIFACT_LAYOUT_ENV, IN_PLACE_LAYOUT, ServingPlan
from kama.serving_pod import ServingTemplate, serving_pod_manifest
from kamadev.gguf_factory import ModelShape, write_model, write_shards
from runtime.supervisor import ArtifactNotServable, check_artifact


def verified_in_place(claim: Path, path: str) -> ServingPlan:
    """What the import records for a Direct source at `path`, as the plan carries it."""
    activities = PvcSourceActivities()
    source = PvcSource(root=str(claim), path=path, direct=True)
    resolved = ActivityEnvironment().run(activities.resolve, source)
    found = ActivityEnvironment().run(
        activities.verify_in_place,
        InPlaceRequest(source=source, files=resolved.files, entrypoint=resolved.entrypoint),
    )
    return ServingPlan(
        entrypoint=Path(resolved.entrypoint).name,
        manifest_digest=found.manifest_digest,
        ctx_total=512,
        concurrency=1,
    )


@pytest.fixture
def claim(tmp_path: Path) -> Path:
    root = tmp_path / "claim"
    (root / "models").mkdir(parents=True)
    write_model(root / "models" / "tiny.gguf", shape=ModelShape(seed=3))
    write_model(root / "models" / "other.gguf", shape=ModelShape(seed=4))  # not the artifact
    return root


def test_a_direct_file_is_served_only_with_the_bytes_verified_at_import(claim: Path) -> None:
    plan = verified_in_place(claim, "models/tiny.gguf")
    models = claim / "models"  # what the pod mounts at /models (subPath "models")
    manifest = check_artifact(directory=models, plan=plan, in_place=True)
    assert [f.path for f in manifest.files] == ["tiny.gguf"]

    with pytest.raises(ArtifactNotServable, match="no READY"):
        check_artifact(directory=models, plan=plan)  # the published-blob check

    data = bytearray((models / "tiny.gguf").read_bytes())
    data[-1] ^= 0xFF  # same size, one bit: only a re-hash sees it
    (models / "tiny.gguf").write_bytes(bytes(data))
    with pytest.raises(ArtifactNotServable, match="not the artifact verified at import"):
        check_artifact(directory=models, plan=plan, in_place=True)


def test_a_direct_directory_of_shards_is_checked_whole(tmp_path: Path) -> None:
    claim = tmp_path / "claim"
    (claim / "big").mkdir(parents=True)
    shards = write_shards(claim / "big", stem="big", shape=ModelShape(n_layer=4), n_shards=3)
    plan = verified_in_place(claim, "big")
    assert plan.entrypoint == "big-00001-of-00003.gguf"
    check_artifact(directory=claim / "big", plan=plan, in_place=True)

    shards[1].unlink()
    with pytest.raises(ArtifactNotServable, match=re.escape("big-00002-of-00003.gguf is missing")):
        check_artifact(directory=claim / "big", plan=plan, in_place=True)


def test_a_symlink_out_of_the_mounted_directory_is_refused(claim: Path) -> None:
    plan = verified_in_place(claim, "models/tiny.gguf")
    outside = claim / "elsewhere.gguf"
    os.rename(claim / "models" / "tiny.gguf", outside)
    (claim / "models" / "tiny.gguf").symlink_to(outside)  # same bytes, outside /models
    with pytest.raises(ArtifactNotServable, match="outside"):
        check_artifact(directory=claim / "models", plan=plan, in_place=True)


def test_a_plan_naming_the_file_from_the_claim_root_is_refused(claim: Path) -> None:
    plan = verified_in_place(claim, "models/tiny.gguf")
    doubled = dataclasses.replace(plan, entrypoint="models/tiny.gguf")
    with pytest.raises(ArtifactNotServable, match="not a file name"):
        check_artifact(directory=claim / "models", plan=doubled, in_place=True)


def template(*, sub_path: str, digest: str) -> ServingTemplate:
    return ServingTemplate(
        image="kama:dev",
        plan=ServingPlan(
            entrypoint="tiny.gguf", manifest_digest=digest, ctx_total=512, concurrency=1
        ),
        claim_name="claim",
        sub_path=sub_path,
        cpu_request="100m",
        memory_request="64Mi",
    )


def container(t: ServingTemplate) -> dict[str, Any]:
    pod = serving_pod_manifest(
        template=t, namespace="ns", deployment="chat", deployment_uid="u", ordinal=0
    )
    found: dict[str, Any] = pod["spec"]["containers"][0]
    return found


def test_the_pod_says_which_layout_it_mounts() -> None:
    digest = "ab" * 32
    direct = container(template(sub_path="models", digest=digest))
    assert {"name": ARTIFACT_LAYOUT_ENV, "value": IN_PLACE_LAYOUT} in direct["env"]
    assert direct["volumeMounts"] == [  # the directory, read-only, at /models
        {"name": "model", "mountPath": "/models", "subPath": "models", "readOnly": True}
    ]
    cached = container(template(sub_path=f"blobs/sha256/{digest}", digest=digest))
    assert all(e["name"] != ARTIFACT_LAYOUT_ENV for e in cached["env"])
