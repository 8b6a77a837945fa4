"""The host side of one real node: its certificates and configuration files, its
cgroup root, its namespaces (a `kamadev.realnode.init` process under `unshare`), and
the veth that puts it on the stack's bridge. `stop` leaves nothing of the node behind;
`sweep_leftovers` removes what a crashed stack of the same octet left.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from kamadev.binaries import REPO_ROOT
from kamadev.cluster import write_kubeconfig
from kamadev.pki import CertificateAuthority, CertPair
from kamadev.processes import ManagedProcess, wait_until
from kamadev.realnode import cgroups, configs, network
from kamadev.realnode.addresses import StackAddresses
from kamadev.realnode.init import KUBELET_KILL, KUBELET_START, NETWORK_READY, InitConfig

log = logging.getLogger("kamadev")

_NAMESPACE_TIMEOUT_S = 30.0
MAX_NODES = 8  # what a sweep looks for
_STOP_GRACE_S = 40.0


@dataclass(frozen=True)
class NodeImage:
    """An OCI archive containerd imports under `ref` before the kubelet starts."""

    ref: str
    archive: Path
    own_ref: str = ""  # the name the archive's index gives it (when not `ref`)

    @classmethod
    def from_archive(cls, archive: Path) -> NodeImage:
        """The image under the name its oci-archive's index gives it."""
        with tarfile.open(archive) as tar:
            member = tar.extractfile("index.json")
            if member is None:
                raise RuntimeError(f"{archive} has no index.json")
            index = json.load(member)
        own = index["manifests"][0]["annotations"]["io.containerd.image.name"]
        return cls(ref=own, archive=archive, own_ref=own)

    def named(self, ref: str) -> NodeImage:
        return NodeImage(ref=ref, archive=self.archive, own_ref=self.own_ref)


class RealNode:
    def __init__(
        self,
        *,
        name: str,
        index: int,
        nodes: int,
        addresses: StackAddresses,
        directory: Path,
        node_bin: Path,
        ca: CertificateAuthority,
        api_server: str,
        kube_proxy: CertPair,
        images: list[NodeImage],
        stack_id: str,
    ) -> None:
        self.name = name
        self.index = index
        self.nodes = nodes
        self.addresses = addresses
        self.directory = directory
        self.node_bin = node_bin
        self.ca = ca
        self.api_server = api_server
        self.kube_proxy = kube_proxy
        self.images = images
        self.stack_id = stack_id
        self.process: ManagedProcess | None = None

    @property
    def ip(self) -> str:
        return self.addresses.node_ip(self.index)

    @property
    def cgroup_root(self) -> str:
        return self.addresses.cgroup_root(self.index)

    def _write_configs(self) -> Path:
        conf = self.directory / "conf"
        (self.directory / "cni-conf").mkdir(parents=True, exist_ok=True)
        conf.mkdir(parents=True, exist_ok=True)
        kubelet = self.ca.issue(
            name=f"kubelet-{self.name}",
            common_name=f"system:node:{self.name}",
            organization="system:nodes",
            server=True,
            client=True,
            ip_addresses=(self.ip,),
            dns_names=(self.name,),
        )
        layout = configs.NodeLayout(
            name=self.name,
            index=self.index,
            addresses=self.addresses,
            directory=self.directory,
            node_bin=self.node_bin,
            ca_cert=self.ca.pair.cert,
            kubelet_cert=kubelet.cert,
            kubelet_key=kubelet.key,
        )
        write_kubeconfig(
            path=conf / "kubelet.kubeconfig",
            server=self.api_server,
            ca=self.ca.pair.cert,
            user=kubelet,
            name=f"system:node:{self.name}",
        )
        proxy_kubeconfig = write_kubeconfig(
            path=conf / "kube-proxy.kubeconfig",
            server=self.api_server,
            ca=self.ca.pair.cert,
            user=self.kube_proxy,
            name="system:kube-proxy",
        )
        (conf / "containerd.toml").write_text(configs.containerd_config(layout))
        for path, text in configs.registry_hosts(layout).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (self.directory / "cni-conf" / "10-kama.conflist").write_text(configs.cni_config(layout))
        (conf / "kubelet.yaml").write_text(configs.kubelet_config(layout))
        (conf / "kube-proxy.yaml").write_text(
            configs.kube_proxy_config(layout, kubeconfig=proxy_kubeconfig)
        )
        init = InitConfig(
            name=self.name,
            directory=self.directory,
            node_bin=self.node_bin,
            node_ip=self.ip,
            cgroup_root=self.cgroup_root,
            private_dirs=layout.private_dirs,
            images=[
                (image.ref, image.own_ref or image.ref, image.archive) for image in self.images
            ],
        )
        init.dump(conf / "init.json")
        return conf / "init.json"

    def start(self) -> None:
        init_config = self._write_configs()
        cgroups.create_root(root=self.cgroup_root)
        self.process = ManagedProcess(
            name=f"node-{self.name}",
            argv=[
                "unshare",
                "--net",
                "--mount",
                "--propagation",
                "private",
                sys.executable,
                "-m",
                "kamadev.realnode.init",
                str(init_config),
            ],
            log_path=self.directory / "logs" / "init.log",
            stack_id=self.stack_id,
            cwd=REPO_ROOT,
        )
        pid = self.process.pid
        own_netns = os.readlink("/proc/self/ns/net")

        def in_own_namespace() -> bool:
            assert self.process is not None
            self.process.check_alive()
            try:
                return os.readlink(f"/proc/{pid}/ns/net") != own_netns
            except OSError:
                return False

        wait_until(in_own_namespace, timeout=_NAMESPACE_TIMEOUT_S, what=f"{self.name}'s netns")
        cgroups.join_system(root=self.cgroup_root, pid=pid)
        network.wire_node(addresses=self.addresses, index=self.index, pid=pid, nodes=self.nodes)
        (self.directory / NETWORK_READY).touch()

    def check_alive(self) -> None:
        if self.process is not None:
            self.process.check_alive()

    def kill_kubelet(self) -> None:
        """The node's kubelet dies (its containers keep running), as in a crash."""
        assert self.process is not None
        os.kill(self.process.pid, KUBELET_KILL)

    def start_kubelet(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, KUBELET_START)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=_STOP_GRACE_S)
            self.process = None
        killed = cgroups.remove_root(root=self.cgroup_root)
        network.remove_veth(self.addresses, self.index)
        if killed:
            log.info("node %s: killed its %d container processes", self.name, len(killed))


def sweep_leftovers(addresses: StackAddresses) -> None:
    """What a crashed stack that held the same octet left: its nodes' cgroups (and
    every process in them) and its bridge. Its namespaces died with its processes."""
    for name in sorted({path.name for path in cgroups.leftovers(prefix=addresses.cgroup_prefix())}):
        killed = cgroups.remove_root(root="/" + name)
        log.warning("swept cgroup %s left by a crashed stack (%d processes)", name, len(killed))
    for index in range(MAX_NODES):
        network.remove_veth(addresses, index)
    network.remove_bridge(addresses)
