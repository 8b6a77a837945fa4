"""What Kama needs of its Temporal namespace and connection, decided without I/O.

Two facts every process checks or passes on at start-up: the search attributes Kama
puts on its workflows (a namespace without them rejects every start, so a process
says at once which command creates them instead of failing on its first workflow),
and the connection an importer pod gets, derived from the worker's own so that
importers reach the same Temporal with the same kind of credentials. The I/O (listing
the namespace's attributes, loading the profile) is in `kamactl/clients.py`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey

from kama.contracts import KAMA_KIND, KAMA_NAME, KAMA_NAMESPACE

REQUIRED_SEARCH_ATTRIBUTES: Final[tuple[SearchAttributeKey[Any], ...]] = (
    KAMA_KIND,
    KAMA_NAMESPACE,
    KAMA_NAME,
)

# the names `temporal operator search-attribute create --type` takes
CLI_TYPE_NAMES: Final[dict[SearchAttributeIndexedValueType, str]] = {
    SearchAttributeIndexedValueType.TEXT: "Text",
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.DOUBLE: "Double",
    SearchAttributeIndexedValueType.BOOL: "Bool",
    SearchAttributeIndexedValueType.DATETIME: "Datetime",
    SearchAttributeIndexedValueType.KEYWORD_LIST: "KeywordList",
}


def _type_name(value: int) -> str:
    try:
        return CLI_TYPE_NAMES[SearchAttributeIndexedValueType(value)]
    except ValueError:
        return f"type {value}"


@dataclass(frozen=True)
class SearchAttributeProblem:
    name: str
    wanted: str  # the CLI type name Kama needs
    found: str | None  # the type the namespace has it as; None: missing


def search_attribute_problems(*, present: Mapping[str, int]) -> list[SearchAttributeProblem]:
    """Kama's search attributes that the namespace lacks or has with another type;
    `present` maps the namespace's custom attributes to their indexed value type."""
    problems = []
    for key in REQUIRED_SEARCH_ATTRIBUTES:
        wanted = CLI_TYPE_NAMES[key.indexed_value_type]
        found = present.get(key.name)
        if found is None:
            problems.append(SearchAttributeProblem(name=key.name, wanted=wanted, found=None))
        elif found != key.indexed_value_type:
            problems.append(
                SearchAttributeProblem(name=key.name, wanted=wanted, found=_type_name(found))
            )
    return problems


def create_commands(*, namespace: str, problems: list[SearchAttributeProblem]) -> list[str]:
    """The `temporal` commands that create the missing attributes, one per attribute
    (the CLI takes one `--type`, and with several `--name`s it creates only the first)."""
    return [
        shlex.join(
            [
                *("temporal", "operator", "search-attribute", "create"),
                *("--namespace", namespace),
                *("--name", problem.name),
                *("--type", problem.wanted),
            ]
        )
        for problem in problems
        if problem.found is None
    ]


def search_attribute_report(*, namespace: str, problems: list[SearchAttributeProblem]) -> str:
    """What a process says before it exits: what is missing, and the fix."""
    lines = [f"Temporal namespace {namespace!r} is not ready for Kama:"]
    for problem in problems:
        if problem.found is None:
            lines.append(f"  search attribute {problem.name} ({problem.wanted}) is missing")
        else:
            lines.append(
                f"  search attribute {problem.name} is {problem.found}, Kama needs "
                f"{problem.wanted} (remove it with `temporal operator search-attribute "
                f"remove --namespace {shlex.quote(namespace)} --name {problem.name}`, "
                "then create it)"
            )
    commands = create_commands(namespace=namespace, problems=problems)
    if commands:
        lines.append("Create them (with the same TEMPORAL_* connection settings) and restart:")
        lines += [f"  {command}" for command in commands]
    return "\n".join(lines)
