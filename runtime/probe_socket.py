"""The supervisor's probe port, bound before anything else of `kama runtime` is
imported. The kubelet probes readiness as soon as it sees the container running, and
again when that probe's result changes; a probe that meets a closed port is refused,
and the next comes a whole probe period (1 s) later. Bound and listening within a few
milliseconds of the start, the port takes such a probe into its backlog, and the
supervisor answers it once it runs: held until llama-server has loaded
(`Supervisor.ready_when_loaded`). Measured before this (bench_scale_out, 2026-12-05):
the first probe was refused in all 6 new pods, and 4 of them were Ready 0.8 s after
llama-server was."""

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
