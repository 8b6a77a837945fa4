"""The addresses of one stack's real nodes, derived from the octet the stack holds.

A stack claims an octet `O` (a lock file, so two stacks never share one); its nodes
then live on `10.O.0.0/16`: the stack-made host bridge is `10.O.0.1/24`, node `i` is
`10.O.0.(2+i)` and its pods get `10.O.(10+i).0/24`. Nothing here touches the host's
own interfaces; the service range (10.96.0.0/16) is never a stack's octet.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVICE_OCTET = 96  # 10.96.0.0/16 is the cluster's service range
CLUSTER_DNS = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
_POD_SUBNET_BASE = 10


@dataclass(frozen=True)
class StackAddresses:
    octet: int

    def __post_init__(self) -> None:
        if not 1 <= self.octet <= 254 or self.octet == SERVICE_OCTET:
            raise ValueError(f"octet {self.octet} cannot hold a stack's nodes")

    @property
    def bridge(self) -> str:
        """The host-side bridge's interface name (at most 15 characters)."""
        return f"kamabr{self.octet}"

    @property
    def gateway(self) -> str:
        """The host's address on the bridge: what nodes reach the API server at."""
        return f"10.{self.octet}.0.1"

    @property
    def cluster_cidr(self) -> str:
        return f"10.{self.octet}.0.0/16"

    def node_ip(self, index: int) -> str:
        return f"10.{self.octet}.0.{2 + index}"

    def pod_cidr(self, index: int) -> str:
        return f"10.{self.octet}.{_POD_SUBNET_BASE + index}.0/24"

    def host_veth(self, index: int) -> str:
        return f"kamav{self.octet}n{index}"

    def cgroup_root(self, index: int) -> str:
        """The node's cgroupRoot, the same path in every v1 hierarchy."""
        return f"/kama-{self.octet}-node{index}"

    def cgroup_prefix(self) -> str:
        """Every node cgroup of this octet starts with this (what a sweep removes)."""
        return f"kama-{self.octet}-"
