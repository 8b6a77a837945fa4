"""The API models on the Python side: valid specs parse, invalid ones fail with the same
message the CRD's CEL rule gives, camelCase survives a round trip, and the shipped
examples are valid resources."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from kama.api import (
    API_VERSION,
    FINALIZER,
    GROUP,
    VERSION,
    AccessMode,
    ArtifactCondition,
    ArtifactPhase,
    CacheConditionType,
    Condition,
    ConditionStatus,
    GGUFInfo,
    ModelArtifact,
    ModelArtifactSpec,
    ModelArtifactStatus,
    ModelCache,
    ModelCacheSpec,
    PVCSourceMode,
    RetentionPolicy,
    short_digest_of,
)
from kama.api.artifact import (
    CACHE_FORBIDDEN_FOR_DIRECT_RULE,
    CACHE_REQUIRED_FOR_COPY_RULE,
    CACHE_REQUIRED_FOR_HF_RULE,
    HF_FILE_RULES,
    HF_FILES_RULES,
    ONE_SOURCE_RULE,
    PVC_PATH_RULES,
    REVISION_RULES,
)
from kama.api.cache import DELETE_NEEDS_TEMPLATE_RULE, ONE_STORAGE_RULE
from kama.api.deployment import ModelDeployment
from kama.gguf.artifact_status import gguf_info
from kama.gguf.facts import GGUFFacts

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
SHA = "0123456789abcdef" * 4


def hf_spec(**source: Any) -> dict[str, Any]:
    return {
        "source": {"huggingFace": {"repo": "acme/tiny-GGUF", "files": ["tiny.gguf"], **source}},
        "cacheRef": {"name": "models"},
    }


def pvc_spec(*, cache: bool = True, **source: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "source": {"persistentVolumeClaim": {"claimName": "uploads", "path": "m/x.gguf", **source}}
    }
    if cache:
        spec["cacheRef"] = {"name": "models"}
    return spec


def test_constants() -> None:
    assert (GROUP, VERSION, API_VERSION) == ("kama.dev", "v1alpha1", "kama.dev/v1alpha1")
    assert FINALIZER == "kama.dev/finalizer"
    assert [c.value for c in ArtifactCondition] == [
        "SourceResolved",
        "Importing",
        "Verified",
        "Ready",
        "ChecksumMismatch",
        "InvalidGGUF",
        "MissingShard",
        "InsufficientStorage",
        "SourceUnavailable",
        "StorageUnavailable",
    ]
    assert [c.value for c in CacheConditionType] == [
        "Ready",
        "StorageUnavailable",
        "InsufficientCapacity",
    ]


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(hf_spec(), id="hf-minimal"),
        pytest.param(hf_spec(revision="0" * 40), id="hf-commit"),
        pytest.param(hf_spec(files=["Q4_K_M/model-*-of-*.gguf"]), id="hf-shard-pattern"),
        pytest.param(hf_spec(files=["model-*-of-00003.gguf"]), id="hf-shard-pattern-count"),
        pytest.param(
            hf_spec(files=["a-00001-of-00002.gguf", "a-00002-of-00002.gguf"]), id="hf-shards"
        ),
        pytest.param(hf_spec(tokenSecretRef={"name": "hf", "key": "token"}), id="hf-token"),
        pytest.param(pvc_spec(), id="pvc-copy-default"),
        pytest.param(pvc_spec(mode="Copy", path=".hidden/..x/m.gguf"), id="pvc-copy-dotfiles"),
        pytest.param(pvc_spec(cache=False, mode="Direct"), id="pvc-direct"),
        pytest.param({**hf_spec(), "expectedSHA256": SHA, "expectedSize": 1}, id="expected"),
    ],
)
def test_valid_artifact_specs(spec: dict[str, Any]) -> None:
    ModelArtifactSpec.model_validate(spec)


def _too_many() -> dict[str, Any]:
    return hf_spec(files=[f"m{i}.gguf" for i in range(129)])


INVALID_ARTIFACT_SPECS: list[Any] = [
    pytest.param(
        {**hf_spec(), "source": {**hf_spec()["source"], **pvc_spec()["source"]}},
        ONE_SOURCE_RULE.message,
        id="two-sources",
    ),
    pytest.param(
        {"source": {}, "cacheRef": {"name": "m"}}, ONE_SOURCE_RULE.message, id="empty-source"
    ),
    pytest.param({"cacheRef": {"name": "m"}}, "source", id="no-source"),
    pytest.param(
        {"source": hf_spec()["source"]}, CACHE_REQUIRED_FOR_HF_RULE.message, id="hf-without-cache"
    ),
    pytest.param(
        pvc_spec(cache=False), CACHE_REQUIRED_FOR_COPY_RULE.message, id="copy-without-cache"
    ),
    pytest.param(
        pvc_spec(mode="Direct"), CACHE_FORBIDDEN_FOR_DIRECT_RULE.message, id="direct-with-cache"
    ),
    pytest.param(pvc_spec(path="/etc/passwd"), PVC_PATH_RULES[0].message, id="absolute-path"),
    pytest.param(pvc_spec(path="a\\b.gguf"), PVC_PATH_RULES[1].message, id="backslash-path"),
    pytest.param(pvc_spec(path="a/../../b.gguf"), PVC_PATH_RULES[2].message, id="dotdot-path"),
    pytest.param(pvc_spec(path="a//b.gguf"), PVC_PATH_RULES[2].message, id="empty-segment"),
    pytest.param(pvc_spec(path="a/./b.gguf"), PVC_PATH_RULES[2].message, id="dot-segment"),
    pytest.param(pvc_spec(path="a\nb"), "pattern", id="control-char"),
    pytest.param(pvc_spec(mode="Link"), "Copy", id="bad-mode"),
    pytest.param(pvc_spec(claimName="Bad_Name"), "pattern", id="bad-claim-name"),
    pytest.param(hf_spec(repo="no-owner"), "pattern", id="repo-without-owner"),
    pytest.param(hf_spec(repo="a/b/c"), "pattern", id="repo-three-parts"),
    pytest.param(hf_spec(repo="-a/b"), "pattern", id="repo-leading-dash"),
    pytest.param(hf_spec(revision="a..b"), REVISION_RULES[0].message, id="revision-dotdot"),
    pytest.param(hf_spec(revision="a b"), "pattern", id="revision-space"),
    pytest.param(hf_spec(files=[]), "at least 1", id="empty-files"),
    pytest.param(_too_many(), "at most 128", id="129-files"),
    pytest.param(hf_spec(files=["/m.gguf"]), HF_FILE_RULES[0].message, id="absolute-file"),
    pytest.param(hf_spec(files=["../m.gguf"]), HF_FILE_RULES[2].message, id="dotdot-file"),
    pytest.param(hf_spec(files=["*.gguf"]), HF_FILE_RULES[3].message, id="stray-wildcard"),
    pytest.param(
        hf_spec(files=["m-*-of-*.gguf", "x.gguf"]),
        HF_FILES_RULES[0].message,
        id="pattern-and-names",
    ),
    pytest.param(hf_spec(files=["a.gguf", "a.gguf"]), "twice", id="duplicate-file"),
    pytest.param(hf_spec(tokenSecretRef={"name": "hf"}), "key", id="token-without-key"),
    pytest.param({**hf_spec(), "expectedSHA256": SHA.upper()}, "pattern", id="sha-uppercase"),
    pytest.param({**hf_spec(), "expectedSHA256": SHA[:-1]}, "pattern", id="sha-short"),
    pytest.param({**hf_spec(), "expectedSize": 0}, "greater than or equal to 1", id="size-zero"),
    pytest.param({**hf_spec(), "image": "x"}, "Extra inputs", id="unknown-field"),
    pytest.param(
        {**hf_spec(), "source": {"huggingFace": {**hf_spec()["source"]["huggingFace"], "x": 1}}},
        "Extra inputs",
        id="unknown-nested-field",
    ),
]


@pytest.mark.parametrize(("spec", "message"), INVALID_ARTIFACT_SPECS)
def test_invalid_artifact_specs(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        ModelArtifactSpec.model_validate(spec)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"persistentVolumeClaim": {"claimName": "pool"}}, id="existing"),
        pytest.param({"claimTemplate": {"size": "200Gi"}}, id="template"),
        pytest.param(
            {
                "claimTemplate": {
                    "size": "1.5T",
                    "storageClassName": "fast",
                    "accessModes": ["ReadWriteMany", "ReadOnlyMany"],
                },
                "retentionPolicy": "Delete",
            },
            id="template-delete",
        ),
        pytest.param({"claimTemplate": {"size": "1e9", "storageClassName": ""}}, id="no-class"),
    ],
)
def test_valid_cache_specs(spec: dict[str, Any]) -> None:
    ModelCacheSpec.model_validate(spec)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param({}, ONE_STORAGE_RULE.message, id="no-storage"),
        pytest.param(
            {"persistentVolumeClaim": {"claimName": "p"}, "claimTemplate": {"size": "1Gi"}},
            ONE_STORAGE_RULE.message,
            id="two-storages",
        ),
        pytest.param(
            {"persistentVolumeClaim": {"claimName": "p"}, "retentionPolicy": "Delete"},
            DELETE_NEEDS_TEMPLATE_RULE.message,
            id="delete-existing",
        ),
        pytest.param({"claimTemplate": {"size": "lots"}}, "pattern", id="bad-size"),
        pytest.param({"claimTemplate": {"size": "-1Gi"}}, "pattern", id="negative-size"),
        pytest.param({"claimTemplate": {"size": "1Gb"}}, "pattern", id="bad-suffix"),
        pytest.param(
            {"claimTemplate": {"size": "1Gi", "accessModes": []}}, "at least 1", id="no-modes"
        ),
        pytest.param(
            {"claimTemplate": {"size": "1Gi", "accessModes": ["Everyone"]}},
            "ReadWriteOnce",
            id="bad-mode",
        ),
        pytest.param(
            {"claimTemplate": {"size": "1Gi"}, "retentionPolicy": "Keep"}, "Retain", id="bad-policy"
        ),
        pytest.param({"persistentVolumeClaim": {}}, "claimName", id="no-claim-name"),
    ],
)
def test_invalid_cache_specs(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        ModelCacheSpec.model_validate(spec)
    assert message in str(err.value)


def test_defaults() -> None:
    spec = ModelArtifactSpec.model_validate(hf_spec())
    assert spec.source.hugging_face is not None
    assert spec.source.hugging_face.revision == "main"
    pvc = ModelArtifactSpec.model_validate(pvc_spec()).source.persistent_volume_claim
    assert pvc is not None and pvc.mode is PVCSourceMode.COPY
    cache = ModelCacheSpec.model_validate({"claimTemplate": {"size": "1Gi"}})
    assert cache.retention_policy is RetentionPolicy.RETAIN
    assert cache.claim_template is not None
    assert cache.claim_template.access_modes == [AccessMode.READ_WRITE_ONCE]


def _round_trip(model: type[BaseModel], wire: dict[str, Any]) -> dict[str, Any]:
    return model.model_validate(wire).model_dump(mode="json", by_alias=True, exclude_none=True)


def test_camel_case_round_trip() -> None:
    wire: dict[str, Any] = {
        "apiVersion": "kama.dev/v1alpha1",
        "kind": "ModelArtifact",
        "metadata": {"name": "a", "namespace": "ns", "ownerReferences": [{"name": "x"}]},
        "spec": {
            **hf_spec(revision="v1", tokenSecretRef={"name": "hf", "key": "token"}),
            "expectedSHA256": SHA,
            "expectedSize": 10,
        },
        "status": {
            "observedGeneration": 2,
            "phase": "Ready",
            "resolvedCommit": "f" * 40,
            "files": [{"path": "tiny.gguf", "size": 10, "sha256": SHA}],
            "manifestDigest": f"sha256:{SHA}",
            "artifactDigest": f"sha256:{SHA}",
            "shortDigest": SHA[:12],
            "totalSize": 10,
            "gguf": {"architecture": "llama", "headCountKV": 2, "headDimK": 64},
            "servingLocation": {
                "claimName": "models",
                "subPath": f"blobs/sha256/{SHA}",
                "accessModes": ["ReadWriteOnce"],
                "nodeAffinity": {"required": {"nodeSelectorTerms": []}},
            },
            "progress": {"bytesDone": 10, "bytesTotal": 10},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Published",
                    "message": "ok",
                    "lastTransitionTime": "2025-01-02T03:04:05Z",
                    "observedGeneration": 2,
                }
            ],
        },
    }
    out = _round_trip(ModelArtifact, wire)
    assert out["metadata"]["ownerReferences"] == [{"name": "x"}]  # unknown metadata is kept
    assert out == wire


def test_fields_by_python_name() -> None:
    spec = ModelArtifactSpec.model_validate(
        {
            "source": {
                "hugging_face": {"repo": "a/b", "files": ["x.gguf"], "token_secret_ref": None}
            },
            "cache_ref": {"name": "models"},
            "expected_sha256": SHA,
        }
    )
    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    assert dumped["expectedSHA256"] == SHA
    assert "huggingFace" in dumped["source"] and "cacheRef" in dumped


def test_status_from_python() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    status = ModelArtifactStatus(
        phase=ArtifactPhase.IMPORTING,
        conditions=[
            Condition(
                type=ArtifactCondition.IMPORTING,
                status=ConditionStatus.TRUE,
                reason="Downloading",
                last_transition_time=now,
            )
        ],
        short_digest=short_digest_of(f"sha256:{SHA}"),
    )
    dumped = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped["conditions"][0]["type"] == "Importing"
    assert dumped["conditions"][0]["lastTransitionTime"].startswith("2025-01-01T00:00:00")
    assert dumped["shortDigest"] == SHA[:12]
    with pytest.raises(ValidationError):
        Condition(type="Ready", status="Maybe", reason="X", last_transition_time=now)
    with pytest.raises(ValidationError):
        Condition(
            type="Ready", status=ConditionStatus.TRUE, reason="no spaces", last_transition_time=now
        )


def test_gguf_info_from_facts() -> None:
    facts = GGUFFacts(
        architecture="llama",
        name="tiny",
        file_type=15,
        file_type_name="Q4_K_M",
        parameter_count=1000,
        n_layer=2,
        n_ctx_train=4096,
        n_embd=64,
        n_head=4,
        n_head_kv=2,
        n_head_kv_per_layer=None,
        head_dim_k=16,
        head_dim_v=16,
        n_ff=128,
        n_expert=None,
        n_expert_used=None,
        vocab_size=100,
        split_no=None,
        split_count=None,
        split_tensors_count=None,
        tensor_bytes=138,
        tensors={
            "token_embd.weight": 100,
            "blk.0.attn_q.weight": 10,
            "blk.1.attn_q.weight": 20,
            "output_norm.weight": 5,
            "rope_freqs.weight": 3,
        },
    )
    info = gguf_info(facts)
    assert info.model_dump(by_alias=True, exclude_none=True) == {
        "architecture": "llama",
        "fileType": "Q4_K_M",
        "parameterCount": 1000,
        "layers": 2,
        "contextLength": 4096,
        "embeddingLength": 64,
        "headCount": 4,
        "headCountKV": 2,
        "headDimK": 16,
        "headDimV": 16,
        "feedForwardLength": 128,
        "vocabSize": 100,
        "weights": {
            "layers": [10, 20],
            "output": 5,
            "outputTied": True,
            "tokenEmbedding": 100,
            "other": 3,
        },
        # a llama model: every layer full attention, no recurrent state
        "memoryLayout": {
            "slidingLayers": [],
            "recurrentLayers": [],
            "kvFreeLayers": [],
            "recurrentBytesPerLayer": 0,
            "unmodelledFloorBytes": 0,
        },
    }


def test_short_digest() -> None:
    assert short_digest_of(f"sha256:{SHA}") == SHA[:12]
    assert short_digest_of(SHA) == SHA[:12]


def _contains(big: Any, small: Any) -> bool:
    if isinstance(small, dict):
        return isinstance(big, dict) and all(
            k in big and _contains(big[k], v) for k, v in small.items()
        )
    return bool(big == small)


def _example_docs() -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, yaml.safe_load(p.read_text())) for p in sorted(EXAMPLES.glob("*.yaml"))]


def test_examples_parse_into_the_models() -> None:
    docs = _example_docs()
    assert {name for name, _ in docs} >= {
        "modelcache.yaml",
        "modelartifact-huggingface.yaml",
        "modelartifact-pvc-copy.yaml",
        "modelartifact-pvc-direct.yaml",
        "modeldeployment.yaml",
    }
    kinds: dict[str, type[BaseModel]] = {
        "ModelArtifact": ModelArtifact,
        "ModelCache": ModelCache,
        "ModelDeployment": ModelDeployment,
    }
    for name, doc in docs:
        assert "namespace" not in doc["metadata"], name
        parsed = kinds[doc["kind"]].model_validate(doc)
        # Nothing in an example is dropped on the way in.
        again = parsed.model_dump(mode="json", by_alias=True, exclude_none=True)
        assert _contains(again["spec"], doc["spec"]), name
    modes = {
        doc["spec"]["source"]["persistentVolumeClaim"]["mode"]
        for _, doc in docs
        if doc["kind"] == "ModelArtifact" and "persistentVolumeClaim" in doc["spec"]["source"]
    }
    assert modes == {"Copy", "Direct"}


@pytest.mark.parametrize(
    ("field", "forged"),
    [
        ("layers", 300_000_000),
        ("contextLength", 1 << 40),
        ("embeddingLength", 1 << 30),
        ("headCount", 1 << 20),
        ("headCountKV", 1 << 20),
        ("headDimK", 1 << 30),
        ("expertCount", 1 << 20),
        ("feedForwardLength", 1 << 30),
        ("vocabSize", 10**12),
    ],
)
def test_gguf_facts_past_the_parsers_bounds_are_refused_naming_the_field(
    field: str, forged: int
) -> None:
    """The artifact status holds each count to the bounds the import's parser applies
    (`kama.api.gguf_bounds`): a status forged past them does not validate, so neither
    the API server (the CRD's maximum) nor the planner (a condition) accepts it."""
    GGUFInfo.model_validate({field: 1})
    with pytest.raises(ValidationError, match=field):
        GGUFInfo.model_validate({field: forged})
