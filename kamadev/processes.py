"""Child processes of the local stack: started with a marker so none can outlive it.

Every process the stack starts (its nodes' daemons included; containers are found by
their nodes' cgroups, kamadev.realnode.cgroups) carries
`KAMA_STACK_ID` in its environment and dies with its parent (PR_SET_PDEATHSIG).
`sweep` finds leftovers by that marker in /proc, which is also how the tests check
that teardown left nothing behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

STACK_ID_ENV = "KAMA_STACK_ID"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec hook: the kernel kills this child when the spawning thread exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_HANDED_OUT: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(*, host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, outside the kernel's ephemeral range.

    A port from `bind(0)` is an ephemeral one, so between this check and the server's
    own bind an outgoing connection (any client in the stack) can take it; ports
    below (or above) that range are only ever taken by a deliberate bind."""
    low, high = _ephemeral_range()
    candidates = range(20000, low) if low > 21000 else range(high + 1, 65535)
    for port in random.sample(candidates, k=min(200, len(candidates))):
        if port in _HANDED_OUT:
            continue  # not yet bound by whoever got it
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        fallback: int = sock.getsockname()[1]
        return fallback


def wait_for_port(*, host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s") from None
            time.sleep(0.1)


class ManagedProcess:
    """One long-running child with its output in a log file."""

    def __init__(
        self,
        *,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        stack_id: str,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.stack_id = stack_id
        self.env = env
        self.cwd = cwd
        environ = dict(os.environ if env is None else env)
        environ[STACK_ID_ENV] = stack_id
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environ,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(
                f"{self.name} exited with {self.popen.returncode}; last log lines:\n" + self.tail()
            )

    def tail(self, *, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def respawn(self) -> ManagedProcess:
        """The same command started again (after `stop`), logging to the same file."""
        return ManagedProcess(
            name=self.name,
            argv=self.argv,
            log_path=self.log_path,
            stack_id=self.stack_id,
            env=self.env,
            cwd=self.cwd,
        )

    def freeze(self) -> None:
        """SIGSTOP the process group: a stalled host or a network partition, as clients
        see it (connections stay open, nothing answers)."""
        os.killpg(self.popen.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self.popen.pid, signal.SIGCONT)

    def stop(self, *, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        self._log.close()


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def processes_with_marker(*, stack_id: str) -> list[int]:
    """PIDs of live processes whose environment carries this stack's marker."""
    needle = f"{STACK_ID_ENV}={stack_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def sweep(*, stack_id: str) -> list[int]:
    """Kill whatever this stack left running; returns the PIDs it had to kill."""
    leftovers = processes_with_marker(stack_id=stack_id)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return leftovers
