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
from pathlib import PurePosixPath
from typing import Any, Final

from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey
from temporalio.envconfig import ClientConfigProfile

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

# where importer pods mount KAMA_IMPORTER_TEMPORAL_SECRET, with the key of each file
IMPORTER_TEMPORAL_MOUNT: Final = "/etc/kama/temporal-tls"
SECRET_CLIENT_CERT: Final = "tls.crt"
SECRET_CLIENT_KEY: Final = "tls.key"
SECRET_SERVER_CA: Final = "ca.crt"
SECRET_API_KEY: Final = "api-key"


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


# importer pods -----------------------------------------------------------------------


@dataclass(frozen=True)
class ImporterTemporal:
    """How an importer pod connects to Temporal: the worker's connection, with the
    address as pods see it and the credentials' files from `secret` (a Secret in the
    artifact's namespace, since pods mount Secrets of their own namespace only).

    Without a secret the pod gets the worker's file paths as they are (right where
    pods see the worker's files, where both share a filesystem; elsewhere the
    importer names the missing file) and no API key, which never goes into a pod
    spec as plain text."""

    address: str
    namespace: str
    cluster: str = ""
    tls: bool = False
    server_name: str | None = None
    secret: str | None = None
    client_cert: str | None = None  # a path in the pod
    client_key: str | None = None
    server_ca: str | None = None
    api_key_from_secret: bool = False


def _path(source: object, *, secret: str | None, key: str) -> str | None:
    if source is None:
        return None
    if secret is not None:
        return str(PurePosixPath(IMPORTER_TEMPORAL_MOUNT) / key)
    if isinstance(source, PurePosixPath):
        return str(source)
    return None  # data given inline (a profile's `*_data`): nothing to point a pod at


def importer_temporal(
    *,
    profile: ClientConfigProfile,
    address: str,
    namespace: str,
    cluster: str,
    secret: str | None,
) -> ImporterTemporal:
    """The importer pods' connection, from the worker's resolved profile."""
    tls = profile.tls
    uses_tls = (tls is not None and tls.disabled is not True) or (
        tls is None and profile.api_key is not None
    )
    return ImporterTemporal(
        address=address,
        namespace=namespace,
        cluster=cluster,
        tls=uses_tls,
        server_name=tls.server_name if tls is not None and uses_tls else None,
        secret=secret,
        client_cert=_path(tls.client_cert, secret=secret, key=SECRET_CLIENT_CERT)
        if tls is not None and uses_tls
        else None,
        client_key=_path(tls.client_private_key, secret=secret, key=SECRET_CLIENT_KEY)
        if tls is not None and uses_tls
        else None,
        server_ca=_path(tls.server_root_ca_cert, secret=secret, key=SECRET_SERVER_CA)
        if tls is not None and uses_tls
        else None,
        api_key_from_secret=profile.api_key is not None and secret is not None,
    )


def importer_temporal_env(connection: ImporterTemporal) -> list[dict[str, Any]]:
    """The importer container's `env` entries for its Temporal connection."""
    env: list[dict[str, Any]] = [
        {"name": "TEMPORAL_ADDRESS", "value": connection.address},
        {"name": "TEMPORAL_NAMESPACE", "value": connection.namespace},
        {"name": "KAMA_CLUSTER", "value": connection.cluster},
    ]
    if connection.tls:
        env.append({"name": "TEMPORAL_TLS", "value": "true"})
    for name, value in (
        ("TEMPORAL_TLS_SERVER_NAME", connection.server_name),
        ("TEMPORAL_TLS_CLIENT_CERT_PATH", connection.client_cert),
        ("TEMPORAL_TLS_CLIENT_KEY_PATH", connection.client_key),
        ("TEMPORAL_TLS_SERVER_CA_CERT_PATH", connection.server_ca),
    ):
        if value is not None:
            env.append({"name": name, "value": value})
    if connection.api_key_from_secret and connection.secret is not None:
        env.append(
            {
                "name": "TEMPORAL_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": connection.secret, "key": SECRET_API_KEY}},
            }
        )
    return env


def importer_temporal_volume(
    connection: ImporterTemporal,
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The Secret volume and its mount, when the pod's credentials come from one."""
    files = [
        key
        for key, path in (
            (SECRET_CLIENT_CERT, connection.client_cert),
            (SECRET_CLIENT_KEY, connection.client_key),
            (SECRET_SERVER_CA, connection.server_ca),
        )
        if path is not None
    ]
    if connection.secret is None or not files:
        return None
    volume = {
        "name": "temporal-tls",
        "secret": {
            "secretName": connection.secret,
            "items": [{"key": key, "path": key} for key in files],
            "defaultMode": 0o440,
        },
    }
    mount = {"name": "temporal-tls", "mountPath": IMPORTER_TEMPORAL_MOUNT, "readOnly": True}
    return volume, mount
