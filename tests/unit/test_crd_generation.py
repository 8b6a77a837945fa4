"""The CRD generator: the checked-in YAML under deploy/crds matches the models, the
schemas are structural, every CEL rule can be cost-estimated (bounded lists and
strings), rules name real fields, and the printer columns and names are in place."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field, create_model

from kama.api.artifact import ARTIFACT_SPEC_RULES, ONE_SOURCE_RULE
from kama.api.cache import CACHE_SPEC_RULES
from kama.api.crd import (
    GENERATED_HEADER,
    SchemaError,
    all_crds,
    crd_file_name,
    main,
    openapi_schema,
    render_yaml,
)

CRD_DIR = Path(__file__).resolve().parents[2] / "deploy" / "crds"
REGENERATE = "run `python -m kama.api.crd deploy/crds` and commit the result"
FORBIDDEN_KEYS = {"$ref", "$defs", "anyOf", "allOf", "oneOf", "not", "title", "const", "nullable"}
FORBIDDEN_KEYS |= {"uniqueItems", "examples", "definitions"}
FREE_FORM = {("ModelArtifact", "status.servingLocation.nodeAffinity")}


def crds_by_kind() -> dict[str, dict[str, Any]]:
    return {crd["spec"]["names"]["kind"]: crd for crd in all_crds()}


def schema_of(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its dotted path (``[]`` for list items)."""
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}" if path else name)
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


KINDS = ["ModelArtifact", "ModelCache"]


def test_checked_in_yaml_matches_the_models() -> None:
    crds = all_crds()
    expected = {crd_file_name(c): render_yaml(c) for c in crds}
    assert set(expected) == {
        "kama.dev_modelaccesskeys.yaml",
        "kama.dev_modelartifacts.yaml",
        "kama.dev_modelcaches.yaml",
        "kama.dev_modeldeployments.yaml",
    }
    on_disk = {p.name for p in CRD_DIR.glob("*.yaml")}
    assert on_disk >= set(expected), f"missing files in deploy/crds: {REGENERATE}"
    for name, text in expected.items():
        assert (CRD_DIR / name).read_text() == text, (
            f"deploy/crds/{name} is out of date with kama/api: {REGENERATE}"
        )


def test_rendering_is_deterministic_and_round_trips() -> None:
    assert [render_yaml(c) for c in all_crds()] == [render_yaml(c) for c in all_crds()]
    for crd in all_crds():
        text = render_yaml(crd)
        assert text.startswith(GENERATED_HEADER)
        assert yaml.safe_load(text) == crd


def test_cli_writes_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path), "--check"]) == 1
    assert main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "kama.dev_modelaccesskeys.yaml",
        "kama.dev_modelartifacts.yaml",
        "kama.dev_modelcaches.yaml",
        "kama.dev_modeldeployments.yaml",
    ]
    assert main([str(tmp_path), "--check"]) == 0
    (tmp_path / "kama.dev_modelcaches.yaml").write_text("# edited\n")
    assert main([str(tmp_path), "--check"]) == 1
    assert "python -m kama.api.crd" in capsys.readouterr().err


@pytest.mark.parametrize("kind", KINDS)
def test_crd_metadata(kind: str) -> None:
    crd = crds_by_kind()[kind]
    plural = {"ModelArtifact": "modelartifacts", "ModelCache": "modelcaches"}[kind]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == f"{plural}.kama.dev"
    spec = crd["spec"]
    assert spec["group"] == "kama.dev" and spec["scope"] == "Namespaced"
    names = spec["names"]
    assert names["plural"] == plural and names["singular"] == kind.lower()
    assert names["shortNames"] == [{"ModelArtifact": "ma", "ModelCache": "mc"}[kind]]
    assert names["categories"] == ["kama"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    root = schema_of(crd)
    assert root["type"] == "object" and root["required"] == ["spec"]
    assert root["properties"]["metadata"] == {"type": "object"}
    assert set(root["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}


def test_printer_columns() -> None:
    crds = crds_by_kind()

    def columns(kind: str) -> list[tuple[str, str, str]]:
        (version,) = crds[kind]["spec"]["versions"]
        return [
            (c["name"].upper(), c["type"], c["jsonPath"])
            for c in version["additionalPrinterColumns"]
        ]

    ready = ("READY", "string", '.status.conditions[?(@.type=="Ready")].status')
    age = ("AGE", "date", ".metadata.creationTimestamp")
    workflow = ("WORKFLOW", "string", ".status.workflowID")  # -o wide: kubectl → Temporal
    assert columns("ModelArtifact") == [
        ready,
        ("PHASE", "string", ".status.phase"),
        ("SIZE", "integer", ".status.totalSize"),
        ("DIGEST", "string", ".status.shortDigest"),
        age,
        workflow,
    ]
    assert columns("ModelCache") == [
        ready,
        ("CLAIM", "string", ".status.claimName"),
        ("CAPACITY", "string", ".status.capacity"),
        ("FREE", "integer", ".status.freeBytes"),
        age,
        workflow,
    ]
    # Every column points at a field the schema has.
    for kind in KINDS:
        paths = {p for p, _ in walk(schema_of(crds[kind]))}
        for _, _, json_path in columns(kind):
            field = json_path.split("[")[0].lstrip(".")
            if not field.startswith("metadata"):
                assert field in paths, (kind, json_path)


@pytest.mark.parametrize("kind", KINDS)
def test_schema_is_structural(kind: str) -> None:
    for path, node in walk(schema_of(crds_by_kind()[kind])):
        where = f"{kind}: {path or '<root>'}"
        assert not FORBIDDEN_KEYS & set(node), f"{where} has {FORBIDDEN_KEYS & set(node)}"
        assert "type" in node, f"{where} has no type"
        if "properties" in node or "additionalProperties" in node:
            assert node["type"] == "object", where
        assert not ("properties" in node and "additionalProperties" in node), where
        assert node.get("additionalProperties") is not False, where
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert (kind, path) in FREE_FORM, f"{where} is free-form but not declared so"
        if node["type"] == "array":
            assert "items" in node, where
        if "default" in node:
            assert node["default"] is not None, where
        if "description" in node:
            assert "\n" not in node["description"], where
    free = {
        p
        for p, n in walk(schema_of(crds_by_kind()[kind]))
        if n.get("x-kubernetes-preserve-unknown-fields")
    }
    assert free == {p for k, p in FREE_FORM if k == kind}


def _rules(kind: str) -> Iterator[tuple[str, dict[str, Any], dict[str, str]]]:
    for path, node in walk(schema_of(crds_by_kind()[kind])):
        for rule in node.get("x-kubernetes-validations", []):
            yield path, node, rule


@pytest.mark.parametrize("kind", KINDS)
def test_cel_rules_have_bounded_inputs(kind: str) -> None:
    """The apiserver estimates each rule's cost from maxItems/maxLength; without them
    it rejects the CRD. Every list and string a rule can reach must be bounded."""
    roots = {path for path, _, _ in _rules(kind)}
    assert roots
    nodes = dict(walk(schema_of(crds_by_kind()[kind])))
    for root in roots:
        for path, node in walk(nodes[root], root):
            if node["type"] == "array":
                assert "maxItems" in node, (
                    f"{kind}: {path} is reached by CEL at {root} but unbounded"
                )
            if node["type"] == "string":
                assert "maxLength" in node, (
                    f"{kind}: {path} is reached by CEL at {root} but unbounded"
                )


@pytest.mark.parametrize("kind", KINDS)
def test_cel_rules_are_well_formed(kind: str) -> None:
    for path, node, rule in _rules(kind):
        assert set(rule) <= {"rule", "message", "fieldPath", "reason"}, rule
        assert rule["rule"].strip() and rule["message"].strip()
        # The message names the field a user has to fix.
        assert re.search(r"\bspec\.[A-Za-z]", rule["message"]), rule
        if "reason" in rule:
            assert rule["reason"] in {
                "FieldValueInvalid",
                "FieldValueRequired",
                "FieldValueForbidden",
                "FieldValueDuplicate",
            }
        if "fieldPath" in rule:
            field = rule["fieldPath"].removeprefix(".")
            assert field in node["properties"], rule
        if node["type"] == "object":
            # self.x / oldSelf.x / has(self.x): x must be a property of this node.
            for name in re.findall(r"\b(?:self|oldSelf)\.([A-Za-z_][A-Za-z0-9_]*)", rule["rule"]):
                assert name in node["properties"], f"{kind}: {path}: {rule['rule']} uses {name}"
        if "oldSelf" in rule["rule"]:
            assert "immutable" in rule["message"], rule
        else:
            assert "immutable" not in rule["message"], rule


def test_model_rules_land_where_expected() -> None:
    artifact = schema_of(crds_by_kind()["ModelArtifact"])["properties"]["spec"]
    assert artifact["x-kubernetes-validations"] == [r.to_schema() for r in ARTIFACT_SPEC_RULES]
    source = artifact["properties"]["source"]
    assert source["x-kubernetes-validations"] == [ONE_SOURCE_RULE.to_schema()]
    cache = schema_of(crds_by_kind()["ModelCache"])["properties"]["spec"]
    assert cache["x-kubernetes-validations"] == [r.to_schema() for r in CACHE_SPEC_RULES]
    assert artifact["required"] == ["source"]
    assert "expectedSHA256" in artifact["properties"]
    hf = source["properties"]["huggingFace"]
    assert hf["properties"]["files"]["maxItems"] == 128
    assert hf["properties"]["files"]["x-kubernetes-list-type"] == "set"
    assert hf["properties"]["revision"]["default"] == "main"


# ----- the generator refuses what a CRD cannot express --------------------------------


def _schema_for(spec_type: type[BaseModel]) -> dict[str, Any]:
    return openapi_schema(create_model("Res", spec=(spec_type, ...)))


class _WithSet(BaseModel):
    tags: set[str]


class _WithUnion(BaseModel):
    value: int | str


class _WithFreeDict(BaseModel):
    extra: dict[str, Any]


class _WithMap(BaseModel):
    labels: dict[str, str] = Field(max_length=4)


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    count: int = Field(default=1, gt=0)
    note: str | None = None


@pytest.mark.parametrize(
    ("spec_type", "message"),
    [
        pytest.param(_WithSet, "uniqueItems", id="set"),
        pytest.param(_WithUnion, "anyOf", id="union"),
        pytest.param(_WithFreeDict, "x-kubernetes-preserve-unknown-fields", id="free-dict"),
    ],
)
def test_generator_rejects_non_structural_types(spec_type: type[BaseModel], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        _schema_for(spec_type)


def test_generator_translates_json_schema_idioms() -> None:
    closed = _schema_for(_Closed)["properties"]["spec"]
    assert "additionalProperties" not in closed
    assert closed["properties"]["count"] == {
        "type": "integer",
        "default": 1,
        "minimum": 0,
        "exclusiveMinimum": True,
    }
    assert closed["properties"]["note"] == {"type": "string"}
    mapping = _schema_for(_WithMap)["properties"]["spec"]["properties"]["labels"]
    assert mapping == {
        "type": "object",
        "maxProperties": 4,
        "additionalProperties": {"type": "string"},
    }
