"""Running a benchmark's own process inside a pod's network namespace: on real nodes a
pod IP exists only there, so an upstream or relay that must sit on pod networking is
started with nsenter into the namespace of one of the pod's processes (found by the
pod UID its cgroup names). The process stays this host's: its CPU time is read from
/proc like any other."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from kamadev.binaries import REPO_ROOT
from kamadev.processes import wait_for_port
from tests.support import eventually


def pod_process(pod: dict[str, Any]) -> int | None:
    """A process of the pod on this host, if one runs yet."""
    marker = f"pod{pod['metadata']['uid']}"
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cgroup").read_text():
                    return int(entry.name)
            except OSError:
                continue
    return None


def start_in_pod_netns(
    pod: dict[str, Any] | None, argv: list[str], *, listens_on: tuple[str, int]
) -> subprocess.Popen[bytes]:
    """Start `argv` (from the repository root) in the pod's network namespace, or in
    this host's when `pod` is None; return once it accepts on `listens_on`."""
    if pod is not None:
        pid = eventually(lambda: pod_process(pod), timeout=60, what="a process of the pod")
        argv = ["nsenter", f"--net=/proc/{pid}/ns/net", *argv]
    process = subprocess.Popen(argv, cwd=REPO_ROOT)
    try:
        wait_for_port(host=listens_on[0], port=listens_on[1], timeout=30)
    except TimeoutError:
        process.kill()
        raise AssertionError(f"{argv} never listened (exit {process.wait()})") from None
    return process
