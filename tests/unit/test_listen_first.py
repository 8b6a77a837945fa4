"""`kama-listen-first`, the serving image's entrypoint (deploy/images/listen-first.c),
built here as the image build builds it and run as the container runs it: a readiness
probe that comes in the runtime's first moments, before Python could listen, is held
and answered instead of refused; the socket reaches the runtime as systemd hands one
over and goes no further (not to llama-server); without it the runtime listens as
before."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kamadev.processes import free_port

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "deploy/images/listen-first.c"
HOST = "127.0.0.1"
STARTUP_S = 0.5  # how long a test waits for a refusal, or a connect attempt

# The runtime's part, held in its start (before it reaches `listen_for_probes`) until
# the test writes a line to it, as a busy node holds it: it takes the probe socket as
# `kama runtime` does, says what it got, and answers one probe.
RUNTIME = textwrap.dedent(
    """
    import json, os, sys
    sys.stdin.readline()
    from runtime.probe_socket import listen_for_probes
    listener = listen_for_probes(host="127.0.0.1", port=int(sys.argv[1]))
    print(json.dumps({
        "fd": listener.fileno(),
        "inheritable": listener.get_inheritable(),
        "env": {k: os.environ.get(k) for k in ("LISTEN_FDS", "LISTEN_PID", "KAMA_LISTEN_FIRST")},
    }), flush=True)
    connection, _ = listener.accept()
    connection.recv(4096)
    connection.sendall(b"HTTP/1.0 200 OK\\r\\ncontent-length: 5\\r\\n\\r\\nready")
    connection.close()
    """
)
# the hand-over variables, gone before llama-server (the runtime's child) starts
KEPT_FROM_LLAMA_SERVER = {"LISTEN_FDS": None, "LISTEN_PID": None, "KAMA_LISTEN_FIRST": None}


@pytest.fixture(scope="module")
def listen_first(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The program, compiled with the image build's flags (deploy/images/build.sh)."""
    binary = tmp_path_factory.mktemp("listen-first") / "kama-listen-first"
    subprocess.run(
        ["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-static", "-s", "-o", binary, SOURCE],
        check=True,
    )
    return binary


def start_runtime(listen_first: Path, *, port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [listen_first, sys.executable, "-c", RUNTIME, str(port)],
        cwd=REPO,
        env={**os.environ, **env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def port() -> int:
    return free_port()


def connect(port: int, *, within: float) -> socket.socket:
    """A connection to `port`, as the kubelet's probe makes one: retried while refused,
    for `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            return socket.create_connection((HOST, port), timeout=STARTUP_S + 5)
        except ConnectionRefusedError:
            time.sleep(0.001)
    raise AssertionError(f"nothing listened on {port} within {within} s")


def let_start(runtime: subprocess.Popen[str]) -> None:
    """End the runtime's start: it goes on to take its socket."""
    assert runtime.stdin is not None
    runtime.stdin.write("go\n")
    runtime.stdin.flush()


def ask(connection: socket.socket) -> bytes:
    """A readiness probe's request on `connection`, and the whole answer."""
    with connection:
        connection.sendall(b"GET /readyz HTTP/1.1\r\nHost: pod\r\n\r\n")
        return b"".join(iter(lambda: connection.recv(4096), b""))


def test_a_probe_in_the_runtimes_first_moments_is_held_and_answered(
    listen_first: Path, port: int
) -> None:
    runtime = start_runtime(
        listen_first, port=port, env={"KAMA_LISTEN_FIRST": str(port), "POD_IP": HOST}
    )
    try:
        # connected while the runtime is still held in its start, before it could
        # listen: only kama-listen-first can have taken the connection
        connection = connect(port, within=STARTUP_S + 5)
        assert runtime.poll() is None, "the runtime ended in its start"
        let_start(runtime)
        answer = ask(connection)
        out, err = runtime.communicate(timeout=10)
    finally:
        runtime.kill()
    said = json.loads(out)
    assert answer.startswith(b"HTTP/1.0 200 OK") and answer.endswith(b"ready"), (answer, err)
    # handed over as systemd does (fd 3), then kept from llama-server
    assert said["fd"] == 3 and said["inheritable"] is False, said
    assert said["env"] == KEPT_FROM_LLAMA_SERVER, said


def test_without_it_the_runtime_listens_itself_and_an_early_probe_is_refused(
    listen_first: Path, port: int
) -> None:
    """Asked for a port it cannot listen on (here: no POD_IP, no port), the program
    runs the command all the same; the runtime binds the port itself, and a probe
    during its start is refused, as every first probe was before this program."""
    runtime = start_runtime(listen_first, port=port, env={"KAMA_LISTEN_FIRST": "not-a-port"})
    try:
        time.sleep(STARTUP_S / 5)  # the program's moment to listen, were it to
        with pytest.raises(ConnectionRefusedError):  # the runtime is still held
            socket.create_connection((HOST, port), timeout=1)
        let_start(runtime)
        answer = ask(connect(port, within=10))
        out, err = runtime.communicate(timeout=10)
    finally:
        runtime.kill()
    assert answer.endswith(b"ready"), (answer, err)
    said = json.loads(out)
    assert said["inheritable"] is False and said["env"] == KEPT_FROM_LLAMA_SERVER, said
    assert "cannot listen on (no POD_IP) port not-a-port; the command will" in err
