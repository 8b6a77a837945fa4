"""A stack's real nodes as one unit: the bridge they share (made before the API server
starts, since it listens on the bridge's host address), the nodes themselves, and
the cluster DNS they serve. Stopping it leaves no process, mount, cgroup, interface or
iptables rule of the nodes on the host.
"""

from __future__ import annotations

from pathlib import Path

from kubernetes import client as k8s

from kamadev.binaries import NodeBinaries
from kamadev.pki import CertificateAuthority
from kamadev.processes import wait_until
from kamadev.realnode import configs, dns, network
from kamadev.realnode.addresses import StackAddresses
from kamadev.realnode.host import check_host
from kamadev.realnode.node import NodeImage, RealNode, sweep_leftovers

PAUSE_IMAGE_ARCHIVE = "pause.tar"
COREDNS_IMAGE_ARCHIVE = "coredns.tar"
_READY_TIMEOUT_S = 180.0


def node_name(index: int) -> str:
    return f"kama-node-{index}"


class RealNodes:
    def __init__(
        self, *, count: int, octet: int, workdir: Path, binaries: NodeBinaries, stack_id: str
    ) -> None:
        self.count = count
        self.addresses = StackAddresses(octet=octet)
        self.workdir = workdir
        self.binaries = binaries
        self.stack_id = stack_id
        self.nodes: list[RealNode] = []
        self._bridge = False

    @property
    def names(self) -> list[str]:
        return [node_name(i) for i in range(self.count)]

    def prepare_network(self) -> str:
        """Sweep what a crashed stack of this octet left, make the bridge; returns the
        host's address on it (where the API server must listen)."""
        check_host()
        sweep_leftovers(self.addresses)
        network.create_bridge(self.addresses)
        self._bridge = True
        return self.addresses.gateway

    def start(
        self,
        *,
        api: k8s.ApiClient,
        api_server: str,
        ca: CertificateAuthority,
        images: list[NodeImage],
    ) -> None:
        pause = NodeImage.from_archive(self.binaries.images / PAUSE_IMAGE_ARCHIVE)
        if pause.ref != configs.PAUSE_IMAGE:
            raise RuntimeError(
                f"build-node.sh made {pause.ref}, containerd pins {configs.PAUSE_IMAGE}"
            )
        coredns = NodeImage.from_archive(self.binaries.images / COREDNS_IMAGE_ARCHIVE)
        all_images = [pause, coredns, *images]
        kube_proxy = ca.issue(name="kube-proxy", common_name="system:kube-proxy", client=True)
        for index in range(self.count):
            node = RealNode(
                name=node_name(index),
                index=index,
                nodes=self.count,
                addresses=self.addresses,
                directory=self.workdir / node_name(index),
                node_bin=self.binaries.bin,
                ca=ca,
                api_server=api_server,
                kube_proxy=kube_proxy,
                images=all_images,
                stack_id=self.stack_id,
            )
            self.nodes.append(node)
            node.start()
        core = k8s.CoreV1Api(api)
        for node in self.nodes:
            wait_until(
                lambda node=node: _ready(core, node),  # type: ignore[misc]
                timeout=_READY_TIMEOUT_S,
                what=f"node {node.name} Ready",
            )
        dns.install(api, image=coredns.ref)

    def check_alive(self) -> None:
        for node in self.nodes:
            node.check_alive()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes.clear()
        if self._bridge:
            network.remove_bridge(self.addresses)
            self._bridge = False


def _ready(core: k8s.CoreV1Api, node: RealNode) -> bool:
    node.check_alive()
    try:
        obj = core.read_node(node.name)
    except k8s.ApiException:
        return False
    conditions = {c.type: c.status for c in (obj.status.conditions or [])}
    taints = [t for t in obj.spec.taints or [] if t.key.startswith("node.kubernetes.io/")]
    return conditions.get("Ready") == "True" and not taints
