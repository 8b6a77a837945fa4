"""A serving pod told to stop while it starts stops: the SIGTERM the kubelet sends when
a pod is deleted (a deployment deleted or scaled in the moment its replica was
created) ends the runtime even in its first milliseconds, before the runtime has set
its own handler. As PID 1 of its own PID namespace it would ignore that signal, run
on, load and serve until its grace period (the drain timeout + 15 s) ran out and the
kubelet killed it, and a deletion waiting for the pod waited as long.

The signal is sent as the kubelet's runtime sends it, from the host, to the runtime
process found by its environment the moment it has been started."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.conftest import KamaControl
from tests.integration.test_serving_plane import deployment, ready_artifact
from tests.support import apply, eventually

FIND_TIMEOUT_S = 120
STOP_WITHIN_S = 10


def started_process(marker: bytes, *, timeout: float) -> tuple[int, float]:
    """The first process whose environment holds `marker` (a whole `NAME=value`), and
    when it was found. A process's environment is read again only when its name
    changed (an exec: runc's init becomes the container's program under one pid)."""
    seen: set[tuple[str, bytes]] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                key = (entry, Path(f"/proc/{entry}/comm").read_bytes())
                if key in seen:
                    continue
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                return int(entry), time.monotonic()
            seen.add(key)
        time.sleep(0.002)
    raise AssertionError(f"no process with {marker!r} within {timeout} s")


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_serving_pod_stopped_as_it_starts_stops_at_once(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    ready_artifact(control, namespace, tmp_path, name="brief", seed=64)
    apply(
        control.stack,
        deployment(
            namespace, "brief", "brief", replicas=1,
            runtime={"contextSize": 256}, resources={"cpu": "100m"},
        ),
    )  # fmt: skip
    marker = f"LLAMA_ARG_ALIAS={namespace}/brief".encode()
    pid, found = started_process(marker, timeout=FIND_TIMEOUT_S)
    os.kill(pid, signal.SIGTERM)  # as the container runtime does when the pod is deleted
    late = time.monotonic() - found
    eventually(
        lambda: not running(pid),
        timeout=STOP_WITHIN_S,
        interval=0.1,
        what=f"the runtime (pid {pid}, signalled {late * 1000:.0f} ms after it was found) to stop",
    )
