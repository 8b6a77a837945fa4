"""The stack-made network real nodes live on: one host bridge per stack, one veth
per node into the node's own network namespace, and the routes between pod ranges.

Node `i` reaches other nodes' pods through their node IPs on the shared bridge (no
forwarding through the host), and the host reaches pods through routes on the bridge.
Removing the bridge removes its routes; a node's veth goes with its namespace.
"""

from __future__ import annotations

import subprocess

from kamadev.realnode.addresses import StackAddresses


def ip(*args: str, netns_pid: int | None = None) -> str:
    argv = ["ip", *args]
    if netns_pid is not None:
        argv = ["nsenter", f"--net=/proc/{netns_pid}/ns/net", *argv]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result.stdout


def link_exists(name: str) -> bool:
    return (
        subprocess.run(["ip", "link", "show", name], capture_output=True, check=False).returncode
        == 0
    )


def create_bridge(addresses: StackAddresses) -> None:
    """The host side of the stack's node network (a leftover of a crash is replaced)."""
    remove_bridge(addresses)
    ip("link", "add", addresses.bridge, "type", "bridge")
    ip("addr", "add", f"{addresses.gateway}/24", "dev", addresses.bridge)
    ip("link", "set", addresses.bridge, "up")


def remove_bridge(addresses: StackAddresses) -> None:
    if link_exists(addresses.bridge):
        ip("link", "del", addresses.bridge)


def wire_node(*, addresses: StackAddresses, index: int, pid: int, nodes: int) -> None:
    """Give the node whose namespace holds `pid` its eth0 on the stack bridge, a
    default route to the host, and routes to the other nodes' pod ranges."""
    host_end = addresses.host_veth(index)
    if link_exists(host_end):
        ip("link", "del", host_end)
    ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", str(pid))
    ip("link", "set", host_end, "master", addresses.bridge)
    ip("link", "set", host_end, "up")
    ip("link", "set", "lo", "up", netns_pid=pid)
    ip("addr", "add", f"{addresses.node_ip(index)}/24", "dev", "eth0", netns_pid=pid)
    ip("link", "set", "eth0", "up", netns_pid=pid)
    ip("route", "add", "default", "via", addresses.gateway, netns_pid=pid)
    for other in range(nodes):
        if other != index:
            ip(
                "route",
                "add",
                addresses.pod_cidr(other),
                "via",
                addresses.node_ip(other),
                netns_pid=pid,
            )
    ip("route", "replace", addresses.pod_cidr(index), "via", addresses.node_ip(index))
