"""Generates Kama's CustomResourceDefinitions from the pydantic API models.

The pydantic models in ``kama.api`` are the single source of truth; this module turns
their JSON schema into the *structural* OpenAPI v3 schema Kubernetes requires (every
``$ref`` inlined, optionals as plain optional fields, no ``title``/``anyOf``, a ``type``
on every node, ``additionalProperties`` only for real maps) and wraps it in a
CustomResourceDefinition with the status subresource, printer columns and names.
Anything in the JSON schema it does not know how to translate is an error, so a model
change can never silently produce a CRD the apiserver would reject or read differently.

``python -m kama.api.crd <out-dir>`` writes ``kama.dev_<plural>.yaml`` for every CRD
(``--check`` compares instead of writing); a unit test fails when the checked-in files
under ``deploy/crds`` drift from the models.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel

from kama.api.access_key import (
    MODELACCESSKEY_KIND,
    MODELACCESSKEY_PLURAL,
    MODELACCESSKEY_SHORT_NAME,
    MODELACCESSKEY_SINGULAR,
    ModelAccessKey,
)
from kama.api.artifact import (
    MODELARTIFACT_KIND,
    MODELARTIFACT_PLURAL,
    MODELARTIFACT_SHORT_NAME,
    MODELARTIFACT_SINGULAR,
    ModelArtifact,
)
from kama.api.cache import (
    MODELCACHE_KIND,
    MODELCACHE_PLURAL,
    MODELCACHE_SHORT_NAME,
    MODELCACHE_SINGULAR,
    ModelCache,
)
from kama.api.deployment import (
    MODELDEPLOYMENT_KIND,
    MODELDEPLOYMENT_PLURAL,
    MODELDEPLOYMENT_SHORT_NAME,
    MODELDEPLOYMENT_SINGULAR,
    ModelDeployment,
)
from kama.api.meta import GROUP, VERSION, CelRule

__all__ = [
    "PrinterColumn",
    "all_crds",
    "crd_file_name",
    "crd_manifest",
    "main",
    "openapi_schema",
    "render_yaml",
]

CATEGORIES: Final = ("kama",)
GENERATED_HEADER: Final = (
    "# Generated from the pydantic models in kama/api by `python -m kama.api.crd deploy/crds`.\n"
    "# Do not edit: change the models and regenerate.\n"
)
_YAML_WIDTH = 100

# Schema keywords that carry over unchanged (after recursion where they hold schemas).
_PLAIN_KEYS: Final = frozenset(
    {
        "description",
        "type",
        "format",
        "enum",
        "default",
        "pattern",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "required",
        "x-kubernetes-validations",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-int-or-string",
    }
)
# Keywords dropped on purpose: titles are noise, examples have no CRD equivalent (the
# singular `example` would be), and `additionalProperties: false` is implied by a
# structural schema (unknown fields are pruned, or rejected by strict field validation).
_DROPPED_KEYS: Final = frozenset({"title", "examples"})
_KEY_ORDER: Final = (
    "description",
    "type",
    "format",
    "enum",
    "default",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "items",
    "additionalProperties",
    "properties",
    "required",
    "x-kubernetes-validations",
)
_RULE_KEY_ORDER: Final = ("rule", "message", "messageExpression", "fieldPath", "reason")
_NULL: Final = {"type": "null"}


@dataclass(frozen=True)
class PrinterColumn:
    """One ``additionalPrinterColumns`` entry (what ``kubectl get`` shows)."""

    name: str
    type: str  # integer, number, string, boolean or date
    json_path: str
    description: str | None = None
    priority: int | None = None

    def to_manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description is not None:
            out["description"] = self.description
        if self.priority is not None:
            out["priority"] = self.priority
        return out


def _ready_column(kind: str) -> PrinterColumn:
    return PrinterColumn(
        name="Ready",
        type="string",
        json_path='.status.conditions[?(@.type=="Ready")].status',
        description=f"Status of the {kind}'s Ready condition.",
    )


_AGE_COLUMN: Final = PrinterColumn(name="Age", type="date", json_path=".metadata.creationTimestamp")
_WORKFLOW_COLUMN: Final = PrinterColumn(
    name="Workflow",
    type="string",
    json_path=".status.workflowID",
    description="The Temporal workflow keeping the resource.",
    priority=1,  # `kubectl get -o wide`
)


class SchemaError(ValueError):
    """The pydantic JSON schema holds something a structural CRD schema cannot express."""


# ----- JSON schema -> structural schema ------------------------------------------------


def _merge(*, base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """``overlay``'s keywords win, except CEL rules, which accumulate (type's, then field's)."""
    out = dict(base)
    for key, value in overlay.items():
        if key == "x-kubernetes-validations" and key in out:
            out[key] = [*out[key], *value]
        else:
            out[key] = value
    return out


def _structural(node: Mapping[str, Any], *, defs: Mapping[str, Any], where: str) -> dict[str, Any]:
    rest = {k: v for k, v in node.items() if k not in ("$ref", "anyOf", "allOf", "oneOf")}
    if "oneOf" in node:
        raise SchemaError(f"{where}: oneOf cannot be expressed structurally")
    # Combinators are resolved by merging the raw schemas first, so that keywords next to
    # a `$ref` (a field's description, default, CEL rules) apply to the inlined type.
    if "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        if name not in defs:
            raise SchemaError(f"{where}: unknown $ref {node['$ref']}")
        return _structural(_merge(base=defs[name], overlay=rest), defs=defs, where=where)
    if "allOf" in node:
        if len(node["allOf"]) != 1:
            raise SchemaError(f"{where}: allOf with several schemas is not supported")
        return _structural(_merge(base=node["allOf"][0], overlay=rest), defs=defs, where=where)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o != _NULL]
        if len(options) != 1 or len(node["anyOf"]) != 2:
            raise SchemaError(
                f"{where}: anyOf other than `X | None` cannot be expressed structurally"
            )
        return _structural(_merge(base=options[0], overlay=rest), defs=defs, where=where)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "description":
            out[key] = " ".join(str(value).split())
        elif key == "default":
            if value is not None:
                out[key] = copy.deepcopy(value)
        elif key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "type":
            if not isinstance(value, str) or value == "null":
                raise SchemaError(f"{where}: type {value!r} is not a single non-null type")
            out[key] = value
        elif key == "uniqueItems":
            raise SchemaError(
                f"{where}: uniqueItems is not allowed in CRDs; use x-kubernetes-list-type: set"
            )
        elif key == "properties":
            out[key] = {
                name: _structural(sub, defs=defs, where=f"{where}.{name}")
                for name, sub in value.items()
            }
        elif key == "items":
            out[key] = _structural(value, defs=defs, where=f"{where}[]")
        elif key == "additionalProperties":
            if isinstance(value, Mapping):
                out[key] = _structural(value, defs=defs, where=f"{where}{{}}")
            elif value is True and not node.get("x-kubernetes-preserve-unknown-fields"):
                raise SchemaError(
                    f"{where}: a free-form object needs x-kubernetes-preserve-unknown-fields"
                )
            # additionalProperties: false (closed object) is what structural means anyway.
        elif key in _PLAIN_KEYS:
            out[key] = copy.deepcopy(value)
        else:
            raise SchemaError(f"{where}: JSON schema keyword {key!r} has no CRD translation")

    if "properties" in out or "additionalProperties" in out:
        out.setdefault("type", "object")
    if "properties" in out and "additionalProperties" in out:
        raise SchemaError(f"{where}: properties and additionalProperties are exclusive")
    if out.get("type") == "string" and "enum" in out and "maxLength" not in out:
        # A bound lets the apiserver estimate the cost of CEL rules over the value.
        out["maxLength"] = max(len(str(v)) for v in out["enum"])
    return out


def _ordered(node: Any) -> Any:
    """Canonical key order, so the YAML reads the same way everywhere and diffs stay small."""
    if isinstance(node, list):
        return [_ordered(v) for v in node]
    if not isinstance(node, dict):
        return node
    if "rule" in node:  # one x-kubernetes-validations entry
        return {k: node[k] for k in _RULE_KEY_ORDER if k in node}
    rank = {k: i for i, k in enumerate(_KEY_ORDER)}
    out: dict[str, Any] = {}
    for key in sorted(node, key=lambda k: (rank.get(k, len(rank)), k)):
        value = node[key]
        if key == "properties":
            out[key] = {name: _ordered(sub) for name, sub in value.items()}
        elif key in ("default", "enum"):
            out[key] = value
        else:
            out[key] = _ordered(value)
    return out


def openapi_schema(
    model: type[BaseModel], *, spec_validations: Sequence[CelRule] = ()
) -> dict[str, Any]:
    """The structural ``openAPIV3Schema`` for a resource model with spec and status."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    # apiVersion, kind and metadata are the apiserver's: replaced by the standard stanzas.
    top = {k: v for k, v in raw.items() if k != "$defs"}
    top["properties"] = {
        k: v for k, v in raw.get("properties", {}).items() if k in ("spec", "status")
    }
    root = _structural(top, defs=defs, where=model.__name__)
    props = root["properties"]
    if "spec" not in props:
        raise SchemaError(f"{model.__name__} has no spec")
    spec = props["spec"]
    if spec_validations:
        spec["x-kubernetes-validations"] = [
            *spec.get("x-kubernetes-validations", []),
            *(r.to_schema() for r in spec_validations),
        ]
    root["properties"] = {
        "apiVersion": {
            "description": "APIVersion defines the versioned schema of this representation"
            " of an object.",
            "type": "string",
        },
        "kind": {
            "description": "Kind is a string value representing the REST resource this"
            " object represents.",
            "type": "string",
        },
        "metadata": {"type": "object"},
        **props,
    }
    root["required"] = [r for r in root.get("required", []) if r == "spec"]
    return _ordered(root)  # type: ignore[no-any-return]


def crd_manifest(
    model: type[BaseModel],
    *,
    kind: str,
    plural: str,
    singular: str,
    short_names: Sequence[str],
    printer_columns: Sequence[PrinterColumn],
    spec_validations: Sequence[CelRule] = (),
    categories: Sequence[str] = CATEGORIES,
    group: str = GROUP,
    version: str = VERSION,
    scale: bool = False,
    status: bool = True,
) -> dict[str, Any]:
    """A namespaced, single-version CustomResourceDefinition with the status subresource
    (unless the resource has no status) and `/scale` over spec.replicas /
    status.replicas / status.selector when asked."""
    subresources: dict[str, Any] = {"status": {}} if status else {}
    if scale:
        subresources["scale"] = {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{group}",
            "labels": {"app.kubernetes.io/part-of": "kama"},
        },
        "spec": {
            "group": group,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": list(categories),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    **({"subresources": subresources} if subresources else {}),
                    "additionalPrinterColumns": [c.to_manifest() for c in printer_columns],
                    "schema": {
                        "openAPIV3Schema": openapi_schema(model, spec_validations=spec_validations)
                    },
                }
            ],
        },
    }


def all_crds() -> list[dict[str, Any]]:
    """Every CRD Kama defines."""
    return [
        crd_manifest(
            ModelArtifact,
            kind=MODELARTIFACT_KIND,
            plural=MODELARTIFACT_PLURAL,
            singular=MODELARTIFACT_SINGULAR,
            short_names=[MODELARTIFACT_SHORT_NAME],
            printer_columns=[
                _ready_column(MODELARTIFACT_KIND),
                PrinterColumn(
                    name="Phase",
                    type="string",
                    json_path=".status.phase",
                    description="Lifecycle phase of the import.",
                ),
                PrinterColumn(
                    name="Size",
                    type="integer",
                    json_path=".status.totalSize",
                    description="Total size of the files in bytes.",
                ),
                PrinterColumn(
                    name="Digest",
                    type="string",
                    json_path=".status.shortDigest",
                    description="First 12 hex characters of the artifact digest.",
                ),
                _AGE_COLUMN,
                _WORKFLOW_COLUMN,
            ],
        ),
        crd_manifest(
            ModelCache,
            kind=MODELCACHE_KIND,
            plural=MODELCACHE_PLURAL,
            singular=MODELCACHE_SINGULAR,
            short_names=[MODELCACHE_SHORT_NAME],
            printer_columns=[
                _ready_column(MODELCACHE_KIND),
                PrinterColumn(
                    name="Claim",
                    type="string",
                    json_path=".status.claimName",
                    description="PersistentVolumeClaim backing the cache.",
                ),
                PrinterColumn(
                    name="Capacity",
                    type="string",
                    json_path=".status.capacity",
                    description="Capacity of the bound claim.",
                ),
                PrinterColumn(
                    name="Free",
                    type="integer",
                    json_path=".status.freeBytes",
                    description="Free bytes, as last reported by an importer.",
                ),
                _AGE_COLUMN,
                _WORKFLOW_COLUMN,
            ],
        ),
        crd_manifest(
            ModelDeployment,
            kind=MODELDEPLOYMENT_KIND,
            plural=MODELDEPLOYMENT_PLURAL,
            singular=MODELDEPLOYMENT_SINGULAR,
            short_names=[MODELDEPLOYMENT_SHORT_NAME],
            scale=True,
            printer_columns=[
                PrinterColumn(
                    name="Model",
                    type="string",
                    json_path=".spec.modelRef.name",
                    description="The ModelArtifact served.",
                ),
                PrinterColumn(
                    name="Mode",
                    type="string",
                    json_path=".status.profile.mode",
                    description="CPU, GPU or Hybrid, as placed.",
                ),
                PrinterColumn(
                    name="Desired",
                    type="integer",
                    json_path=".status.desiredReplicas",
                    description=(
                        "Replicas Kama converges to now: spec.replicas (kubectl scale, wake,"
                        " idle, autoscaling) within minReplicas and maxReplicas."
                    ),
                ),
                PrinterColumn(
                    name="Max",
                    type="integer",
                    json_path=".spec.scaling.maxReplicas",
                    description="The most replicas autoscaling may ask for.",
                ),
                PrinterColumn(
                    name="Ready",
                    type="string",
                    json_path=".status.ready",
                    description="Ready replicas / desired replicas.",
                ),
                PrinterColumn(
                    name="Reason",
                    type="string",
                    json_path=".status.reason",
                    description="What the deployment is doing or waiting for.",
                ),
                _AGE_COLUMN,
                _WORKFLOW_COLUMN,
            ],
        ),
        crd_manifest(
            ModelAccessKey,
            kind=MODELACCESSKEY_KIND,
            plural=MODELACCESSKEY_PLURAL,
            singular=MODELACCESSKEY_SINGULAR,
            short_names=[MODELACCESSKEY_SHORT_NAME],
            status=False,  # read by the gateway only; nothing reports back
            printer_columns=[
                PrinterColumn(
                    name="Disabled",
                    type="boolean",
                    json_path=".spec.disabled",
                    description="The key is refused.",
                ),
                PrinterColumn(
                    name="RPM",
                    type="integer",
                    json_path=".spec.requestsPerMinute",
                    description="Requests per minute allowed (per gateway replica).",
                ),
                PrinterColumn(
                    name="TPM",
                    type="integer",
                    json_path=".spec.tokensPerMinute",
                    description="Tokens per minute allowed (per gateway replica).",
                ),
                _AGE_COLUMN,
            ],
        ),
    ]


def crd_file_name(crd: Mapping[str, Any]) -> str:
    """``<group>_<plural>.yaml``, the usual name of a generated CRD file."""
    spec = crd["spec"]
    return f"{spec['group']}_{spec['names']['plural']}.yaml"


def render_yaml(crd: Mapping[str, Any]) -> str:
    """Deterministic YAML for one CRD (a header comment, then the manifest)."""
    body = yaml.safe_dump(dict(crd), sort_keys=False, width=_YAML_WIDTH, allow_unicode=False)
    return GENERATED_HEADER + body


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kama.api.crd", description="Write Kama's CRD YAML from the API models."
    )
    parser.add_argument("out_dir", type=Path, help="directory to write into, e.g. deploy/crds")
    parser.add_argument(
        "--check", action="store_true", help="compare with the files there instead of writing"
    )
    args = parser.parse_args(argv)
    out_dir: Path = args.out_dir
    stale: list[str] = []
    for crd in all_crds():
        path = out_dir / crd_file_name(crd)
        text = render_yaml(crd)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(path)
    if stale:
        print(
            f"out of date: {', '.join(stale)}; run `python -m kama.api.crd {out_dir}`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
