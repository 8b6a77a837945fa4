"""Kama's Temporal set-up without a server: the search-attribute check and its fix,
the connection settings' precedence (`KAMA_TEMPORAL_*` over `TEMPORAL_*` over the
config file), and the cluster identity in every
workflow ID and task queue."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from temporalio.common import SearchAttributeIndexedValueType as T

from kama.config import Settings, cluster_name_problem
from kama.contracts import (
    ObjectRef,
    artifact_workflow_id,
    cache_workflow_id,
    control_task_queue,
    deployment_workflow_id,
    drain_workflow_id,
    import_workflow_id,
    importer_task_queue,
    rollout_workflow_id,
    verify_workflow_id,
    wake_workflow_id,
)
from kama.temporal_setup import (
    create_commands,
    search_attribute_problems,
    search_attribute_report,
)
from kamactl.clients import temporal_profile

ALL = {"KamaKind": T.KEYWORD, "KamaNamespace": T.KEYWORD, "KamaName": T.KEYWORD}


# search attributes ----------------------------------------------------------------


def test_a_namespace_with_every_attribute_has_no_problem() -> None:
    assert search_attribute_problems(present={**ALL, "Other": T.INT}) == []


def test_missing_attributes_give_the_command_that_creates_them() -> None:
    present = {"KamaKind": T.KEYWORD}
    problems = search_attribute_problems(present=present)
    assert [(p.name, p.found) for p in problems] == [("KamaNamespace", None), ("KamaName", None)]
    commands = create_commands(namespace="kama prod", problems=problems)
    assert [shlex.split(c) for c in commands] == [
        [
            *("temporal", "operator", "search-attribute", "create"),
            *("--namespace", "kama prod", "--name", name, "--type", "Keyword"),
        ]
        for name in ("KamaNamespace", "KamaName")
    ]
    report = search_attribute_report(namespace="kama prod", problems=problems)
    assert "KamaNamespace (Keyword) is missing" in report
    assert all(command in report for command in commands)


def test_an_attribute_of_another_type_is_reported_with_how_to_replace_it() -> None:
    problems = search_attribute_problems(present={**ALL, "KamaName": T.TEXT})
    assert [(p.name, p.wanted, p.found) for p in problems] == [("KamaName", "Keyword", "Text")]
    assert create_commands(namespace="default", problems=problems) == []
    report = search_attribute_report(namespace="default", problems=problems)
    assert "KamaName is Text, Kama needs Keyword" in report
    assert "search-attribute remove --namespace default --name KamaName" in report


# connection settings ---------------------------------------------------------------


def _config_file(tmp_path: Path) -> Path:
    path = tmp_path / "temporal.toml"
    path.write_text(
        '[profile.default]\naddress = "file:7233"\nnamespace = "from-file"\n'
        '[profile.cloud]\naddress = "cloud:7233"\nnamespace = "acme.kama"\napi_key = "k"\n'
    )
    return path


def test_defaults_without_any_setting(tmp_path: Path) -> None:
    env = {"TEMPORAL_CONFIG_FILE": str(tmp_path / "absent.toml")}
    profile = temporal_profile(Settings(), env=env)
    assert (profile.address, profile.namespace) == ("localhost:7233", "default")
    assert profile.to_client_connect_config().get("tls") is None


def test_precedence_kama_over_temporal_env_over_config_file(tmp_path: Path) -> None:
    file_env = {"TEMPORAL_CONFIG_FILE": str(_config_file(tmp_path))}
    profile = temporal_profile(Settings(), env=file_env)
    assert (profile.address, profile.namespace) == ("file:7233", "from-file")

    temporal_env = {**file_env, "TEMPORAL_ADDRESS": "env:7233", "TEMPORAL_NAMESPACE": "from-env"}
    profile = temporal_profile(Settings(), env=temporal_env)
    assert (profile.address, profile.namespace) == ("env:7233", "from-env")

    kama_env = {
        **temporal_env,
        "KAMA_TEMPORAL_ADDRESS": "kama:7233",
        "KAMA_TEMPORAL_NAMESPACE": "k",
    }
    profile = temporal_profile(Settings.from_env(kama_env), env=kama_env)
    assert (profile.address, profile.namespace) == ("kama:7233", "k")


def test_a_profile_and_its_api_key_mean_tls(tmp_path: Path) -> None:
    env = {"TEMPORAL_CONFIG_FILE": str(_config_file(tmp_path)), "TEMPORAL_PROFILE": "cloud"}
    config = temporal_profile(Settings(), env=env).to_client_connect_config()
    assert config["target_host"] == "cloud:7233"
    assert config["namespace"] == "acme.kama"
    assert (config["api_key"], config["tls"]) == ("k", True)


# importer pods -----------------------------------------------------------------------


def _env_of(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in entries}


# cluster identity ------------------------------------------------------------------


def _ids(cluster: str) -> list[str]:
    ref = ObjectRef(namespace="team-a", name="llama", uid="u-1", cluster=cluster)
    return [
        artifact_workflow_id(ref),
        cache_workflow_id(ref),
        deployment_workflow_id(ref),
        rollout_workflow_id(ref, number=3),
        import_workflow_id(ref, operation="op"),
        verify_workflow_id(ref, operation="op"),
        importer_task_queue(ref, operation="op"),
        wake_workflow_id(cluster=cluster, namespace="team-a", name="llama"),
        drain_workflow_id(cluster=cluster, namespace="team-a", pod="llama-0"),
        Settings(cluster=cluster).control_task_queue,
    ]


def test_the_unnamed_cluster_keeps_the_ids_kama_always_had() -> None:
    assert _ids("") == [
        "artifact/team-a/llama/u-1",
        "cache/team-a/llama/u-1",
        "deployment/team-a/llama/u-1",
        "rollout/team-a/llama/3",
        "import/team-a/llama/op",
        "verify/team-a/llama/op",
        "kama-importer-team-a-u-1-op",
        "wake/team-a/llama",
        "drain/team-a/llama-0",
        "kama-control",
    ]
    # a ref recorded before refs had a cluster is the unnamed cluster's
    assert ObjectRef(namespace="a", name="b", uid="c").cluster == ""


def test_two_clusters_sharing_a_namespace_share_no_id_and_no_queue() -> None:
    east, west = _ids("east"), _ids("west")
    assert not set(east) & set(west)
    assert not set(east) & set(_ids(""))
    assert all(i.startswith("east:") for i in east)
    assert control_task_queue(cluster="west", queue="kama-control") == "west:kama-control"


def test_the_cluster_name_comes_from_kama_cluster_and_must_be_a_dns_label() -> None:
    settings = Settings.from_env({"KAMA_CLUSTER": "prod-eu", "KAMA_CONTROL_QUEUE": "q"})
    assert (settings.cluster, settings.control_task_queue) == ("prod-eu", "prod-eu:q")
    assert cluster_name_problem("") is None
    for bad in ("Prod", "a:b", "-a", "a" * 64, "a/b"):
        assert cluster_name_problem(bad)
        with pytest.raises(ValueError, match="KAMA_CLUSTER"):
            Settings.from_env({"KAMA_CLUSTER": bad})
