"""The supervisor's probe port, bound before anything else of `kama runtime` is
imported. The kubelet probes readiness when it sees the container start, and again at
the pod's next sync or a probe period (1 s) later; a probe that meets a closed port is
refused and waits for the next. Bound and listening as early as the process can, the
port takes a probe that arrives while the runtime starts into its backlog, and the
supervisor answers it once it runs, held until llama-server has loaded
(`Supervisor.ready_when_loaded`). The very first probe comes about 5 ms after the
container starts (bench_scale_out with the kubelet's log at -v=4, 2026-12-05), before
any Python process listens, so it is still refused; what this saves is the probes of
the next syncs, which came during the imports."""

from __future__ import annotations

import os
import socket

from kama.ports import SUPERVISOR_PORT

BACKLOG = 64


def pod_ip() -> str:
    """The address the runtime listens on: the pod's IP (the downward API's POD_IP)."""
    return os.environ.get("POD_IP", "127.0.0.1")


def listen_for_probes(*, host: str, port: int = SUPERVISOR_PORT) -> socket.socket:
    """A TCP socket bound to `host`:`port` and listening."""
    return socket.create_server((host, port), backlog=BACKLOG)
