"""The generated CRDs on a real apiserver: they install, the examples are accepted,
``kubectl get`` shows the printer columns, and bad specs (including changes to
immutable fields) are rejected by ``kubectl apply`` alone, with an error that names the
offending field. No webhook or controller runs: everything here is the schema's work
(OpenAPI validation, strict field validation, CEL rules)."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kamadev.stack import LocalStack
from tests.support import get_json, kubectl

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "deploy" / "crds"
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("*.yaml"))
API_VERSION = "kama.dev/v1alpha1"
SHA_A = "a" * 64
SHA_B = "b" * 64


def artifact(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ModelArtifact",
        "metadata": {"name": name},
        "spec": spec,
    }


def cache(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ModelCache",
        "metadata": {"name": name},
        "spec": spec,
    }


def hf(**overrides: Any) -> dict[str, Any]:
    source = {"repo": "acme/tiny-GGUF", "files": ["tiny-q4_k_m.gguf"], **overrides}
    return {"huggingFace": source}


def pvc(**overrides: Any) -> dict[str, Any]:
    source = {"claimName": "uploads", "path": "models/tiny.gguf", "mode": "Copy", **overrides}
    return {"persistentVolumeClaim": source}


CACHE_REF = {"name": "models"}

# (id, manifest, a substring of the error that names the offending field)
INVALID_CASES: list[tuple[str, dict[str, Any], str]] = [
    (
        "two-sources",
        artifact("two-sources", {"source": {**hf(), **pvc()}, "cacheRef": CACHE_REF}),
        "spec.source.persistentVolumeClaim",
    ),
    ("no-source", artifact("no-source", {"cacheRef": CACHE_REF}), "spec.source"),
    (
        "empty-source",
        artifact("empty-source", {"source": {}, "cacheRef": CACHE_REF}),
        "spec.source",
    ),
    ("hf-without-cache-ref", artifact("hf-without-cache-ref", {"source": hf()}), "spec.cacheRef"),
    (
        "copy-without-cache-ref",
        artifact("copy-without-cache-ref", {"source": pvc()}),
        "spec.cacheRef",
    ),
    (
        "direct-with-cache-ref",
        artifact("direct-with-cache-ref", {"source": pvc(mode="Direct"), "cacheRef": CACHE_REF}),
        "spec.cacheRef",
    ),
    (
        "absolute-path",
        artifact("absolute-path", {"source": pvc(path="/etc/passwd"), "cacheRef": CACHE_REF}),
        "spec.source.persistentVolumeClaim.path",
    ),
    (
        "dotdot-path",
        artifact("dotdot-path", {"source": pvc(path="models/../../x.gguf"), "cacheRef": CACHE_REF}),
        "spec.source.persistentVolumeClaim.path",
    ),
    (
        "backslash-path",
        artifact("backslash-path", {"source": pvc(path="models\\x.gguf"), "cacheRef": CACHE_REF}),
        "spec.source.persistentVolumeClaim.path",
    ),
    (
        "bad-claim-name",
        artifact("bad-claim-name", {"source": pvc(claimName="Uploads!"), "cacheRef": CACHE_REF}),
        "spec.source.persistentVolumeClaim.claimName",
    ),
    (
        "bad-mode",
        artifact("bad-mode", {"source": pvc(mode="Link"), "cacheRef": CACHE_REF}),
        "spec.source.persistentVolumeClaim.mode",
    ),
    (
        "bad-repo",
        artifact("bad-repo", {"source": hf(repo="not a repo"), "cacheRef": CACHE_REF}),
        "spec.source.huggingFace.repo",
    ),
    (
        "revision-with-dotdot",
        artifact("revision-with-dotdot", {"source": hf(revision="a..b"), "cacheRef": CACHE_REF}),
        "spec.source.huggingFace.revision",
    ),
    (
        "too-many-files",
        artifact(
            "too-many-files",
            {"source": hf(files=[f"m-{i}.gguf" for i in range(129)]), "cacheRef": CACHE_REF},
        ),
        "spec.source.huggingFace.files",
    ),
    (
        "empty-files",
        artifact("empty-files", {"source": hf(files=[]), "cacheRef": CACHE_REF}),
        "spec.source.huggingFace.files",
    ),
    (
        "absolute-file",
        artifact("absolute-file", {"source": hf(files=["/m.gguf"]), "cacheRef": CACHE_REF}),
        "spec.source.huggingFace.files",
    ),
    (
        "dotdot-file",
        artifact("dotdot-file", {"source": hf(files=["../m.gguf"]), "cacheRef": CACHE_REF}),
        "spec.source.huggingFace.files",
    ),
    (
        "shard-pattern-and-names",
        artifact(
            "shard-pattern-and-names",
            {"source": hf(files=["m-*-of-*.gguf", "other.gguf"]), "cacheRef": CACHE_REF},
        ),
        "spec.source.huggingFace.files",
    ),
    (
        "stray-wildcard",
        artifact("stray-wildcard", {"source": hf(files=["*.gguf"]), "cacheRef": CACHE_REF}),
        "spec.source.huggingFace.files",
    ),
    (
        "token-secret-without-key",
        artifact(
            "token-secret-without-key",
            {"source": hf(tokenSecretRef={"name": "hf-token"}), "cacheRef": CACHE_REF},
        ),
        "spec.source.huggingFace.tokenSecretRef.key",
    ),
    (
        "bad-sha256",
        artifact("bad-sha256", {"source": hf(), "cacheRef": CACHE_REF, "expectedSHA256": "ABC123"}),
        "spec.expectedSHA256",
    ),
    (
        "zero-expected-size",
        artifact("zero-expected-size", {"source": hf(), "cacheRef": CACHE_REF, "expectedSize": 0}),
        "spec.expectedSize",
    ),
    (
        "unknown-field",
        artifact("unknown-field", {"source": hf(), "cacheRef": CACHE_REF, "image": "evil:latest"}),
        "spec.image",
    ),
    (
        "cache-with-two-storages",
        cache(
            "cache-with-two-storages",
            {"persistentVolumeClaim": {"claimName": "pool"}, "claimTemplate": {"size": "1Gi"}},
        ),
        "spec.claimTemplate",
    ),
    ("cache-without-storage", cache("cache-without-storage", {}), "spec.claimTemplate"),
    (
        "delete-existing-claim",
        cache(
            "delete-existing-claim",
            {"persistentVolumeClaim": {"claimName": "pool"}, "retentionPolicy": "Delete"},
        ),
        "spec.retentionPolicy",
    ),
    (
        "bad-access-mode",
        cache("bad-access-mode", {"claimTemplate": {"size": "1Gi", "accessModes": ["Everyone"]}}),
        "spec.claimTemplate.accessModes",
    ),
    (
        "no-access-modes",
        cache("no-access-modes", {"claimTemplate": {"size": "1Gi", "accessModes": []}}),
        "spec.claimTemplate.accessModes",
    ),
    (
        "bad-size",
        cache("bad-size", {"claimTemplate": {"size": "lots"}}),
        "spec.claimTemplate.size",
    ),
]

_VALID_HF = {"source": hf(), "cacheRef": CACHE_REF, "expectedSHA256": SHA_A}

# (id, spec before, spec after, a substring naming the immutable field)
IMMUTABLE_CASES: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("change-repo", _VALID_HF, {**_VALID_HF, "source": hf(repo="acme/other-GGUF")}, "spec.source"),
    ("change-files", _VALID_HF, {**_VALID_HF, "source": hf(files=["x.gguf"])}, "spec.source"),
    ("change-sha256", _VALID_HF, {**_VALID_HF, "expectedSHA256": SHA_B}, "spec.expectedSHA256"),
    (
        "drop-sha256",
        _VALID_HF,
        {k: v for k, v in _VALID_HF.items() if k != "expectedSHA256"},
        "spec.expectedSHA256",
    ),
    ("change-cache-ref", _VALID_HF, {**_VALID_HF, "cacheRef": {"name": "other"}}, "spec.cacheRef"),
    (
        "change-expected-size",
        {**_VALID_HF, "expectedSize": 100},
        {**_VALID_HF, "expectedSize": 200},
        "spec.expectedSize",
    ),
]


def apply_doc(
    stack: LocalStack, namespace: str, doc: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return kubectl(
        stack, "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=False
    )


def test_examples_are_accepted_and_listed(crds: LocalStack, namespace: str) -> None:
    assert len(EXAMPLES) >= 4
    for path in EXAMPLES:
        result = kubectl(crds, "apply", "-n", namespace, "-f", str(path), check=False)
        assert result.returncode == 0, f"{path.name}: {result.stderr}"

    for resource in ("modelartifacts", "ma"):
        out = kubectl(crds, "get", resource, "-n", namespace).stdout
        header = out.splitlines()[0].split()
        assert header == ["NAME", "READY", "PHASE", "SIZE", "DIGEST", "AGE"], out
        assert "qwen2-5-0-5b-instruct-q4-k-m" in out
    out = kubectl(crds, "get", "mc", "-n", namespace).stdout
    assert out.splitlines()[0].split() == ["NAME", "READY", "CLAIM", "CAPACITY", "FREE", "AGE"]
    assert "models" in out
    both = kubectl(crds, "get", "kama", "-n", namespace).stdout
    assert "modelartifact.kama.dev/" in both and "modelcache.kama.dev/" in both


def test_defaults_are_applied(crds: LocalStack, namespace: str) -> None:
    minimal = artifact("minimal", {"source": hf(), "cacheRef": CACHE_REF})
    direct = artifact("direct", {"source": pvc(mode="Direct")})
    copy_default = artifact("copy-default", {"source": pvc(), "cacheRef": CACHE_REF})
    del copy_default["spec"]["source"]["persistentVolumeClaim"]["mode"]
    pool = cache("pool", {"claimTemplate": {"size": "1Gi"}})
    for doc in (minimal, direct, copy_default, pool):
        result = apply_doc(crds, namespace, doc)
        assert result.returncode == 0, result.stderr

    got = get_json(crds, "ma", "minimal", "-n", namespace)
    assert got["spec"]["source"]["huggingFace"]["revision"] == "main"
    got = get_json(crds, "ma", "copy-default", "-n", namespace)
    assert got["spec"]["source"]["persistentVolumeClaim"]["mode"] == "Copy"
    got = get_json(crds, "mc", "pool", "-n", namespace)
    assert got["spec"]["retentionPolicy"] == "Retain"
    assert got["spec"]["claimTemplate"]["accessModes"] == ["ReadWriteOnce"]


@pytest.mark.parametrize(
    ("manifest", "field"),
    [pytest.param(manifest, field, id=case_id) for case_id, manifest, field in INVALID_CASES],
)
def test_invalid_spec_is_rejected_naming_the_field(
    crds: LocalStack, namespace: str, manifest: dict[str, Any], field: str
) -> None:
    result = apply_doc(crds, namespace, manifest)
    assert result.returncode != 0, f"accepted: {manifest}"
    assert field in result.stderr, result.stderr


def test_unknown_fields_fail_strict_field_validation(crds: LocalStack, namespace: str) -> None:
    """kubectl apply validates strictly by default (--validate=strict): the apiserver
    refuses unknown fields instead of silently pruning them."""
    doc = artifact("strict", {"source": hf(), "cacheRef": CACHE_REF, "image": "evil:latest"})
    result = apply_doc(crds, namespace, doc)
    assert result.returncode != 0
    assert 'unknown field "spec.image"' in result.stderr, result.stderr
    missing = kubectl(crds, "get", "ma", "strict", "-n", namespace, check=False)
    assert missing.returncode != 0


@pytest.mark.parametrize(
    ("before", "after", "field"),
    [pytest.param(b, a, f, id=case_id) for case_id, b, a, f in IMMUTABLE_CASES],
)
def test_immutable_field_cannot_change(
    crds: LocalStack,
    namespace: str,
    before: dict[str, Any],
    after: dict[str, Any],
    field: str,
) -> None:
    created = apply_doc(crds, namespace, artifact("pinned", copy.deepcopy(before)))
    assert created.returncode == 0, created.stderr
    changed = apply_doc(crds, namespace, artifact("pinned", copy.deepcopy(after)))
    assert changed.returncode != 0, "the change was accepted"
    assert field in changed.stderr, changed.stderr
    assert "immutable" in changed.stderr, changed.stderr
    stored = get_json(crds, "ma", "pinned", "-n", namespace)["spec"]
    for key, value in before.items():
        if key == "source":  # the stored source also carries the defaulted revision
            assert stored[key]["huggingFace"] | value["huggingFace"] == stored[key]["huggingFace"]
        else:
            assert stored[key] == value


def test_cache_storage_can_only_grow(crds: LocalStack, namespace: str) -> None:
    """A claim template's size may grow, nothing else about the storage may change."""
    pool = {"claimTemplate": {"size": "1Gi"}}
    assert apply_doc(crds, namespace, cache("pool", pool)).returncode == 0
    grown = {"claimTemplate": {"size": "2Gi"}, "retentionPolicy": "Delete"}
    result = apply_doc(crds, namespace, cache("pool", grown))
    assert result.returncode == 0, result.stderr
    changes: list[tuple[dict[str, Any], str]] = [
        ({"claimTemplate": {"size": "1000Mi"}}, "spec.claimTemplate.size"),
        (
            {"claimTemplate": {"size": "2Gi", "accessModes": ["ReadWriteMany"]}},
            "spec.claimTemplate.accessModes",
        ),
        ({"persistentVolumeClaim": {"claimName": "other"}}, "spec.persistentVolumeClaim"),
    ]
    for spec, field in changes:
        result = apply_doc(crds, namespace, cache("pool", spec))
        assert result.returncode != 0, f"accepted: {spec}"
        assert field in result.stderr, result.stderr


def test_mutable_fields_can_be_added(crds: LocalStack, namespace: str) -> None:
    """'Immutable once set': expectedSHA256 and expectedSize may be added later."""
    base = {"source": hf(), "cacheRef": CACHE_REF}
    assert apply_doc(crds, namespace, artifact("late", base)).returncode == 0
    later = {**base, "expectedSHA256": SHA_A, "expectedSize": 42}
    result = apply_doc(crds, namespace, artifact("late", later))
    assert result.returncode == 0, result.stderr
