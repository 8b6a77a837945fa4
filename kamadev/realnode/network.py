"""The stack-made network real nodes live on: one host bridge per stack, one veth
per node into the node's own network namespace, and the routes between pod ranges.

Node `i` reaches other nodes' pods through their node IPs on the shared bridge (no
forwarding through the host), and the host reaches pods through routes on the bridge.
Removing the bridge removes its routes; a node's veth goes with its namespace.
"""

from __future__ import annotations

import fcntl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kamadev.realnode.addresses import SERVICE_OCTET, StackAddresses

OCTET_LOCKS = Path(tempfile.gettempdir()) / "kama-octets"


@dataclass
class OctetClaim:
    """The octet `O` of the stack's `10.O.0.0/16`, held with a lock file for the
    stack's life, so two stacks on one machine (a test suite's and `make dev`'s) never
    share addresses, a bridge or cgroups. A crashed stack's lock drops with it; what it
    left is swept by the next stack that claims its octet."""

    octet: int
    lock: IO[bytes]

    @classmethod
    def claim(cls) -> OctetClaim:
        OCTET_LOCKS.mkdir(exist_ok=True)
        for octet in range(1, 255):
            if octet == SERVICE_OCTET:
                continue
            lock = (OCTET_LOCKS / f"10.{octet}.lock").open("ab")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            return cls(octet=octet, lock=lock)
        raise RuntimeError(f"every stack octet is taken (locks in {OCTET_LOCKS})")

    def release(self) -> None:
        self.lock.close()


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


def remove_veth(addresses: StackAddresses, index: int) -> None:
    """The node's veth pair, at once: it would go with the node's network namespace,
    but the kernel destroys a namespace asynchronously, a while after its last process."""
    name = addresses.host_veth(index)
    if link_exists(name):
        try:
            ip("link", "del", name)
        except RuntimeError:
            if link_exists(name):  # not just gone with its namespace meanwhile
                raise


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
