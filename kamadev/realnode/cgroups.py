"""A real node's cgroups on this cgroup-v1 host: made before its kubelet starts,
emptied and removed when it stops, and swept after a crash.

The kubelet runs with the cgroupfs driver under a `cgroupRoot` of its own that must
exist in every v1 hierarchy (with `cpuset.cpus`/`cpuset.mems` copied from the parent,
or no task could join it). Every container of the node lands below that root, so
killing what is there and removing it bottom-up leaves nothing behind.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")
_KILL_TIMEOUT_S = 15.0


def hierarchies() -> list[Path]:
    """The mounted v1 hierarchies (named ones such as `systemd` included)."""
    found = []
    for entry in sorted(CGROUP_FS.iterdir()):
        if entry.name == "unified" or not (entry / "cgroup.procs").exists():
            continue
        found.append(entry)
    return found


SYSTEM = "system"  # below a node's root: its init, containerd, kubelet and the shims


def create_root(*, root: str) -> None:
    """The node's root (the kubelet's cgroupRoot) and its `system` child, in every
    hierarchy; cpusets inherit their parent's CPUs and memory nodes.

    The root weighs as much as a machine's worth of busy tasks (cgroup v1 gives every
    task at the top level the weight 1024 of a whole group): a node's pods compete with
    the stack's own host processes (control plane, Temporal, a test's clients) as a
    machine does with its neighbours, instead of as one more task among many."""
    for hierarchy in hierarchies():
        for path in (hierarchy / root.lstrip("/"), hierarchy / root.lstrip("/") / SYSTEM):
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (path / name).write_text((path.parent / name).read_text())
        if hierarchy.name == "cpu":
            shares = 1024 * (os.cpu_count() or 1)
            (hierarchy / root.lstrip("/") / "cpu.shares").write_text(str(shares))


def join_system(*, root: str, pid: int) -> None:
    """Move `pid` into the node's `system` cgroup in every hierarchy: whatever it
    starts from then on is found (and killed) with the node's root."""
    for hierarchy in hierarchies():
        (hierarchy / root.lstrip("/") / SYSTEM / "cgroup.procs").write_text(str(pid))


def _procs_below(path: Path) -> set[int]:
    pids: set[int] = set()
    for procs in path.rglob("cgroup.procs"):
        try:
            pids.update(int(line) for line in procs.read_text().split())
        except OSError:
            continue
    return pids


def processes_below(root: str) -> set[int]:
    """Every process in the node's cgroups (its daemons and its containers)."""
    paths = [h / root.lstrip("/") for h in hierarchies()]
    return set().union(*(_procs_below(p) for p in paths if p.exists()))


def remove_root(*, root: str) -> list[int]:
    """Kill every process below `root` in every hierarchy and remove its cgroups;
    returns the PIDs that had to be killed."""
    killed: set[int] = set()
    targets = [h / root.lstrip("/") for h in hierarchies()]
    deadline = time.monotonic() + _KILL_TIMEOUT_S
    while True:
        pids = processes_below(root)
        if not pids:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {sorted(pids)} in {root} survived SIGKILL")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    for target in targets:
        if not target.exists():
            continue
        # deepest first: a cgroup with children cannot be removed
        for directory in sorted(
            (p for p in target.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
        ):
            _rmdir(directory)
        _rmdir(target)
    return sorted(killed)


def _rmdir(path: Path) -> None:
    for _ in range(50):  # a cgroup whose last task just died may still be busy briefly
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    path.rmdir()


def leftovers(*, prefix: str) -> list[Path]:
    """Node cgroups whose name starts with `prefix`, in any hierarchy."""
    return [
        path
        for hierarchy in hierarchies()
        for path in hierarchy.iterdir()
        if path.is_dir() and path.name.startswith(prefix)
    ]
