"""The real nodes' addresses and configuration files, read without starting a node:
what keeps two stacks and the service range apart, and the settings this cgroup-v1,
CAP_SYS_RESOURCE-less host needs."""

from __future__ import annotations

import ipaddress
import json
import tomllib
from pathlib import Path

import pytest
import yaml

from kamadev.realnode import configs
from kamadev.realnode.addresses import SERVICE_OCTET, StackAddresses
from kamadev.realnode.host import CGROUP_CONTROLLERS, missing_features

SERVICES = ipaddress.ip_network("10.96.0.0/16")


def layout(tmp_path: Path, *, octet: int = 7, index: int = 1) -> configs.NodeLayout:
    return configs.NodeLayout(
        name=f"kama-node-{index}",
        index=index,
        addresses=StackAddresses(octet=octet),
        directory=tmp_path / "node",
        node_bin=tmp_path / "bin",
        ca_cert=tmp_path / "ca.crt",
        kubelet_cert=tmp_path / "kubelet.crt",
        kubelet_key=tmp_path / "kubelet.key",
    )


@pytest.mark.parametrize("octet", [0, SERVICE_OCTET, 255])
def test_an_octet_that_would_collide_is_refused(octet: int) -> None:
    with pytest.raises(ValueError, match=str(octet)):
        StackAddresses(octet=octet)


def test_stacks_and_nodes_never_share_an_address() -> None:
    seen: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for octet in (1, 2, 95, 97, 254):
        stack = StackAddresses(octet=octet)
        cluster = ipaddress.ip_network(stack.cluster_cidr)
        assert not cluster.overlaps(SERVICES)
        assert all(not cluster.overlaps(other) for other in seen)
        seen.append(cluster)
        pods = [ipaddress.ip_network(stack.pod_cidr(i)) for i in range(2)]
        nodes = [ipaddress.ip_address(stack.node_ip(i)) for i in range(2)]
        assert not pods[0].overlaps(pods[1])
        assert all(p.subnet_of(cluster) for p in pods)  # type: ignore[arg-type]
        assert all(n in cluster and not any(n in p for p in pods) for n in nodes)
        assert len(stack.bridge) <= 15 and len(stack.host_veth(1)) <= 15


def test_kubelet_runs_on_cgroup_v1_under_its_own_root(tmp_path: Path) -> None:
    config = yaml.safe_load(configs.kubelet_config(layout(tmp_path)))
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == "/kama-7-node1"
    assert config["address"] == "10.7.0.3"
    assert config["clusterDNS"] == ["10.96.0.10"]
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"


def test_containerd_never_lowers_oom_score_and_uses_the_nodes_cni(tmp_path: Path) -> None:
    node = layout(tmp_path)
    config = tomllib.loads(configs.containerd_config(node))
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["cni"]["conf_dir"] == str(node.directory / "cni-conf")
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == configs.PAUSE_IMAGE
    [(hosts, text)] = configs.registry_hosts(node).items()
    assert hosts.parent.parent == Path(images["registry"]["config_path"])
    assert tomllib.loads(text)["server"] == "https://127.0.0.1:1"  # nothing is ever pulled
    cni = json.loads(configs.cni_config(node))
    assert cni["plugins"][0]["ipam"]["ranges"] == [[{"subnet": "10.7.11.0/24"}]]


def test_kube_proxy_knows_the_stacks_pods_as_cluster_traffic(tmp_path: Path) -> None:
    config = yaml.safe_load(configs.kube_proxy_config(layout(tmp_path), kubeconfig=tmp_path / "kc"))
    assert config["mode"] == "iptables"
    assert config["clusterCIDR"] == "10.7.0.0/16"
    assert config["conntrack"]["maxPerCore"] == 0  # the host's conntrack table stays as it is


def test_a_host_without_cgroup_v1_controllers_is_named(tmp_path: Path) -> None:
    for controller in CGROUP_CONTROLLERS:
        if controller != "memory":
            (tmp_path / controller).mkdir()
            (tmp_path / controller / "cgroup.procs").write_text("")
    missing = missing_features(cgroup_fs=tmp_path)
    assert missing == [f"the cgroup v1 'memory' hierarchy at {tmp_path / 'memory'}"]
