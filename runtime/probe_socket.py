"""The supervisor's probe port, listening before anything else of `kama runtime`
runs. The kubelet probes readiness a few milliseconds after the container starts
(about 5 ms: bench_scale_out with the kubelet's log at -v=4, 2026-12-05), and again
a probe period (1 s) later; a probe that meets a closed port is refused and waits
for the next. A listening port instead takes the probe into its backlog, and the
supervisor answers it once it runs, held until llama-server has loaded
(`Supervisor.ready_when_loaded`).

Python cannot listen that soon, so the serving image's entrypoint is
`kama-listen-first` (deploy/images/listen-first.c): asked by KAMA_LISTEN_FIRST (the
serving pod sets it), it listens in the container's first millisecond and execs the
runtime with the socket, as systemd's socket activation hands one over (file
descriptor 3, LISTEN_FDS=1, LISTEN_PID). `listen_for_probes` takes that socket when
it is there and is the probe port; otherwise (another image, the program could not
listen) it binds the port itself, as early as Python can."""

from __future__ import annotations

import os
import socket

from kama.ports import SUPERVISOR_PORT

BACKLOG = 64
LISTEN_FDS_START = 3  # sd_listen_fds(3): the first socket passed


def pod_ip() -> str:
    """The address the runtime listens on: the pod's IP (the downward API's POD_IP)."""
    return os.environ.get("POD_IP", "127.0.0.1")


def listen_for_probes(*, host: str, port: int = SUPERVISOR_PORT) -> socket.socket:
    """A TCP socket listening on `host`:`port`: the one handed over by
    `kama-listen-first`, if it is that, else bound here."""
    return handed_over(port=port) or socket.create_server((host, port), backlog=BACKLOG)


def handed_over(*, port: int) -> socket.socket | None:
    """The listening socket passed to this process as systemd passes one (file
    descriptor 3, LISTEN_FDS=1, LISTEN_PID this process), if it listens on `port`.
    The variables are removed and the socket made close-on-exec, so llama-server,
    the runtime's child, neither takes it for its own nor keeps the port."""
    passed = os.environ.pop("LISTEN_FDS", None)
    pid = os.environ.pop("LISTEN_PID", None)
    os.environ.pop("LISTEN_FDNAMES", None)
    if passed != "1" or pid != str(os.getpid()):
        return None
    try:
        listener = socket.socket(fileno=LISTEN_FDS_START)
    except OSError:  # not a socket
        return None
    listening = listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if listener.type != socket.SOCK_STREAM or not listening or listener.getsockname()[1] != port:
        listener.close()
        return None
    listener.set_inheritable(False)
    return listener
