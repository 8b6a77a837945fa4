"""The import graph keeps the layers the README draws: arrows point inward only.

wiring (`kamactl`) → processes (`watcher`, `gateway`, `runtime`) → `workflows` →
`activities` → `kama` (pure). The gateway names workflows by `kama.contracts` and
imports no `workflows` module; the watcher and the gateway share the list+watch loop
of `informer`, which imports only `kama`. Inside `kama`, the API (`kama.api`, the
source of the CRDs) imports none of the algorithms that act on it. Development
tooling (`kamadev`, `tests`) may import anything; nothing installed imports it. No
module takes part in an import cycle. The graph is read from the source with `ast`,
so lazy imports inside functions count too."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = (
    "kama",
    "kamactl",
    "workflows",
    "activities",
    "informer",
    "watcher",
    "gateway",
    "runtime",
)
PROJECT = (*INSTALLED, "kamadev", "tests")

# which project packages each package may import (itself always)
ALLOWED: dict[str, set[str]] = {
    "kama": set(),
    "activities": {"kama"},
    "workflows": {"kama", "activities"},
    "informer": {"kama"},
    "watcher": {"kama", "workflows", "informer"},
    # workflows by name only (`kama.contracts`); the bounded pod reads the worker makes too
    "gateway": {"kama", "informer", "activities.pod_reads"},
    "runtime": {"kama"},
    "kamactl": {"kama", "activities", "workflows", "informer", "watcher", "gateway", "runtime"},
}

# what acts on the API's types: the API declares its fields with choices and defaults
# of its own (`kama.api.deployment_choices`), never by importing these
ALGORITHMS = (
    "kama.planner",
    "kama.placement_plan",
    "kama.placement_candidates",
    "kama.placement_messages",
    "kama.memory",
    "kama.model_facts",
    "kama.autoscaling",
    "kama.deployment_plan",
    "kama.demand_ledger",
    "kama.replica_keeper",
    "kama.architectures",
    "kama.gguf",
)


def _modules() -> Iterator[tuple[str, Path]]:
    for package in PROJECT:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


def _imports(*, module: str, path: Path) -> set[str]:
    """Project modules imported by `module`, resolved to the longest existing name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in names if name.split(".")[0] in PROJECT}


GRAPH: dict[str, set[str]] = {}
for _name, _path in _modules():
    GRAPH[_name] = _imports(module=_name, path=_path)
KNOWN = set(GRAPH)
for _name, _targets in GRAPH.items():
    # `from pkg import module` names a module; `from module import symbol` names the module
    GRAPH[_name] = {t if t in KNOWN else t.rsplit(".", 1)[0] for t in _targets} & KNOWN
    GRAPH[_name].discard(_name)


def _allowed(*, source: str, target: str) -> bool:
    src_pkg, dst_pkg = source.split(".")[0], target.split(".")[0]
    if src_pkg in ("kamadev", "tests") or src_pkg == dst_pkg:
        return True
    return any(target == rule or target.startswith(f"{rule}.") for rule in ALLOWED[src_pkg])


def test_every_arrow_points_inward() -> None:
    wrong = sorted(
        f"{source} -> {target}"
        for source, targets in GRAPH.items()
        for target in targets
        if not _allowed(source=source, target=target)
    )
    assert wrong == [], "imports against the layers:\n" + "\n".join(wrong)


def test_nothing_installed_imports_development_tooling() -> None:
    leaks = sorted(
        f"{source} -> {target}"
        for source, targets in GRAPH.items()
        if source.split(".")[0] in INSTALLED
        for target in targets
        if target.split(".")[0] in ("kamadev", "tests")
    )
    assert leaks == []


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(GRAPH.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    assert _cycles() == []


def test_the_wheel_ships_only_kama_and_claims_no_foreign_top_level_name() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert sorted(packages) == sorted(INSTALLED)
    assert "localstack" not in packages and "kamadev" not in packages
    assert project["project"]["scripts"]["kama"] == "kamactl.cli:run"


def _is_algorithm(module: str) -> bool:
    return any(module == name or module.startswith(f"{name}.") for name in ALGORITHMS)


def test_the_api_imports_no_algorithm() -> None:
    api = sorted(name for name in GRAPH if name == "kama.api" or name.startswith("kama.api."))
    assert "kama.api.deployment" in api
    wrong = sorted(
        f"{source} -> {target}"
        for source in api
        for target in GRAPH[source]
        if _is_algorithm(target)
    )
    assert wrong == [], "kama.api imports algorithms:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    ("source", "target", "allowed"),
    [
        ("kama.gguf", "activities.kube", False),
        ("activities.kube", "workflows.artifact", False),
        ("gateway.proxy", "watcher.nudge", False),
        ("gateway.app", "watcher.watch", False),
        ("gateway.app", "informer.watch", True),
        ("watcher.main", "informer.watch", True),
        ("informer.watch", "watcher.nudge", False),
        ("informer.watch", "kama.api", True),
        ("gateway.wake", "workflows.wake", False),
        ("gateway.demand", "workflows.deployment", False),
        ("gateway.wake", "kama.contracts", True),
        ("workflows.wake", "activities.serving_pods", True),
        ("kamactl.worker", "workflows.wake", True),
        ("runtime.supervisor", "kamadev.stack", False),
    ],
)
def test_the_rule_itself(source: str, target: str, allowed: bool) -> None:
    assert _allowed(source=source, target=target) is allowed
