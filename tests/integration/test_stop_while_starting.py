"""A serving or importer pod told to stop while it starts stops: the SIGTERM the kubelet
sends when a pod is deleted (a deployment deleted or scaled in the moment its replica
was created, an artifact deleted as its import begins) ends Kama's process even in its
first milliseconds, before it has set its own handler. As PID 1 of its own PID
namespace it would ignore that signal and run on until its grace period ran out (for
a replica the drain timeout + 15 s, for an importer 10 s) and the kubelet killed it,
and a deletion waiting for the pod waited as long.

The signal is sent as the kubelet's runtime sends it, from the host, to the runtime
process found by its environment the moment it has been started."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from kama.importer_protocol import TOKEN_ENV
from tests.conftest import KamaControl
from tests.integration.test_artifact_plane import cache, hf_artifact, publish_model
from tests.integration.test_serving_plane import deployment, ready_artifact
from tests.support import apply, eventually, get_json

FIND_TIMEOUT_S = 120
STOP_WITHIN_S = 10
IMPORTER_STOP_WITHIN_S = 2  # well inside its 10 s grace: a stop it ignored shows


def started_process(marker: bytes, *, timeout: float) -> tuple[int, float]:
    """The first process whose environment holds `marker` (a whole `NAME=value`), and
    when it was found. A process's environment is read again only when its name
    changed (an exec: runc's init becomes the container's program under one pid), or
    while it reads empty: an exec sets the new name before the new environment's bounds
    (`create_elf_tables`), so a read in between finds the new name and no environment."""
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
            if environ or kernel_thread(entry):
                seen.add(key)
        time.sleep(0.002)
    raise AssertionError(f"no process with {marker!r} within {timeout} s")


PF_KTHREAD = 0x00200000


def kernel_thread(pid: str) -> bool:
    """A kernel thread has no environment to wait for (`flags` of /proc/<pid>/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return bool(int(fields[6]) & PF_KTHREAD)


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
    stops_when_signalled(marker, what="the runtime", within=STOP_WITHIN_S)


def test_an_importer_pod_stopped_as_it_starts_stops_at_once(
    kama_control: KamaControl, namespace: str, tmp_path: Path
) -> None:
    control = kama_control
    repo, _, _ = publish_model(control, tmp_path, seed=65)
    apply(control.stack, cache(namespace), hf_artifact(namespace, "early", repo, ["tiny.gguf"]))

    def importer_token() -> str | None:
        """The importer pod's own token (a new one for each pod), once it exists."""
        selector = "kama.dev/role=importer"
        for pod in get_json(control.stack, "pods", "-n", namespace, "-l", selector)["items"]:
            for env in pod["spec"]["containers"][0]["env"]:
                if env["name"] == TOKEN_ENV:
                    return str(env["value"])
        return None

    token = eventually(importer_token, timeout=FIND_TIMEOUT_S, interval=0.05, what="an importer")
    marker = f"{TOKEN_ENV}={token}".encode()
    stops_when_signalled(marker, what="the importer", within=IMPORTER_STOP_WITHIN_S)


def stops_when_signalled(marker: bytes, *, what: str, within: float) -> None:
    """Find the process whose environment holds `marker` the moment it is started, send
    it SIGTERM as the container runtime does when its pod is deleted, and check it
    stops within `within` seconds."""
    pid, found = started_process(marker, timeout=FIND_TIMEOUT_S)
    os.kill(pid, signal.SIGTERM)
    late = time.monotonic() - found
    eventually(
        lambda: not running(pid),
        timeout=within,
        interval=0.1,
        what=f"{what} (pid {pid}, signalled {late * 1000:.0f} ms after it was found) to stop",
    )
