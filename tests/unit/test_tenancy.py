"""What tenants may ask of the nodes and which namespaces are served: the operator's
allow-lists, as the worker applies them before it creates a serving pod (#25)."""

from __future__ import annotations

from kama.config import Settings
from kama.tenancy import TenancyPolicy

CONTROL_PLANE = {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}


def test_by_default_no_toleration_or_label_reaches_control_plane_nodes() -> None:
    policy = Settings.from_env({}).tenancy
    refusals = policy.placement_refusals(
        node_selector={"node-role.kubernetes.io/control-plane": ""},
        tolerations=[CONTROL_PLANE, {"operator": "Exists"}],
    )
    assert len(refusals) == 3
    assert "spec.placement.nodeSelector key 'node-role.kubernetes.io/control-plane'" in refusals[0]
    assert "tenancy.allowedTolerationKeys" in refusals[1]
    assert "every taint" in refusals[2]


def test_hardware_labels_and_the_gpu_taint_are_allowed_by_default() -> None:
    policy = TenancyPolicy()
    assert (
        policy.placement_refusals(
            node_selector={"nvidia.com/gpu.product": "NVIDIA-H100", "kubernetes.io/arch": "amd64"},
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        )
        == []
    )


def test_the_operators_lists_replace_the_defaults() -> None:
    settings = Settings.from_env(
        {
            "KAMA_ALLOWED_NODE_SELECTOR_KEYS": "pool, *",
            "KAMA_ALLOWED_TOLERATION_KEYS": "",
        }
    )
    policy = settings.tenancy
    assert policy.placement_refusals(node_selector={"anything": "x"}, tolerations=[]) == []
    [refusal] = policy.placement_refusals(
        node_selector={}, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]
    )
    assert "'nvidia.com/gpu'" in refusal


def test_served_namespaces_are_a_list() -> None:
    assert Settings.from_env({}).tenancy.serves("anything")
    policy = Settings.from_env({"KAMA_WATCH_NAMESPACE": "team-b, team-a"}).tenancy
    assert policy.watch_namespaces == ("team-a", "team-b")
    assert policy.serves("team-a") and policy.serves("team-b")
    assert not policy.serves("kube-system")
