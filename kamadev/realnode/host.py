"""What a real node needs of this host, checked before anything starts, so a host that
lacks it gets one clear message naming each missing feature instead of a kubelet
failing half-way.

The stack needs: root; cgroup v1 hierarchies for cpu, cpuacct, cpuset, memory, pids,
devices and freezer under /sys/fs/cgroup (this host has no cgroup v2 controllers; the
kubelet runs with `failCgroupV1: false`); overlayfs (containerd's snapshotter);
network and mount namespaces (`unshare`); veth and bridge links; `nsenter`, `ip`,
runc, iptables and socat (from Debian, installed by deploy/local/build-node.sh).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CGROUP_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer")
TOOLS = ("unshare", "nsenter", "ip", "iptables", "runc", "socat")


class HostUnsupported(RuntimeError):
    """This machine cannot run the stack's real nodes; the message says why."""


def missing_features(*, cgroup_fs: Path = Path("/sys/fs/cgroup")) -> list[str]:
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the nodes' namespaces, cgroups and bridge need it)")
    for controller in CGROUP_CONTROLLERS:
        if not (cgroup_fs / controller / "cgroup.procs").exists():
            missing.append(f"the cgroup v1 '{controller}' hierarchy at {cgroup_fs / controller}")
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "overlay" not in filesystems.split():
        missing.append("overlayfs (containerd's snapshotter)")
    for namespace in ("net", "mnt"):
        if not Path(f"/proc/self/ns/{namespace}").exists():
            missing.append(f"{namespace} namespaces")
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    for tool in TOOLS:
        if shutil.which(tool, path=path) is None:
            missing.append(f"the `{tool}` command")
    return missing


def check_host() -> None:
    missing = missing_features()
    if missing:
        raise HostUnsupported(
            "this host cannot run the local stack's real nodes; missing: " + "; ".join(missing)
        )
