"""The README names only what exists: every resource a `kubectl` command in it reads or
changes is a name the CRDs serve (plural, singular, kind or short name) or a
Kubernetes built-in, and every example file it applies is in `deploy/examples`."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
VERBS = "get|describe|wait|scale|delete|patch|edit|label|annotate|explain"
BUILT_IN = frozenset(
    {"pods", "pod", "po", "nodes", "node", "events", "svc", "service", "deploy",
     "deployment", "pvc", "secret", "secrets", "namespace", "ns", "crd", "crds", "all"}
)  # fmt: skip


def served_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "deploy" / "crds").glob("*.yaml"):
        crd_names = yaml.safe_load(path.read_text())["spec"]["names"]
        names |= {crd_names["plural"], crd_names["singular"], crd_names["kind"].lower()}
        names |= set(crd_names.get("shortNames", [])) | set(crd_names.get("categories", []))
    return names


def test_every_kubectl_resource_in_the_readme_exists() -> None:
    known = served_names() | BUILT_IN
    named = re.findall(
        rf"kubectl(?: -n \S+)? (?:{VERBS}) (?:--\S+ )*([a-z][a-z.]*)(?:[/ ]|$)", README
    )
    assert named, "the README shows kubectl commands"
    unknown = sorted({name.split(".")[0] for name in named} - known)
    assert unknown == [], f"the README names resources the cluster does not serve: {unknown}"


def test_every_example_the_readme_applies_exists() -> None:
    applied = re.findall(r"-f (deploy/examples/\S+)", README)
    assert applied and all((ROOT / path).is_file() for path in applied), applied
