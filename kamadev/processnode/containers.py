"""One container as a local process in a private mount namespace, with its probes.

The process is started through `unshare --mount --propagation private`: a short
shell prelude bind-mounts the pod's volumes at their mount paths (read-only where
asked), makes `/` read-only for `readOnlyRootFilesystem`, switches user with
`setpriv` for `runAsUser`, and then execs the image's command.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kamadev.processes import die_with_parent
from kamadev.processnode.config import ImageCommand
from kamadev.processnode.volumes import HostVolume, expand_vars

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_argv(*, image: ImageCommand, container: Any, env: dict[str, str]) -> list[str]:
    """Docker semantics: `command` replaces ENTRYPOINT, `args` replace CMD."""
    if container.command:
        argv = list(container.command) + list(container.args or [])
    else:
        argv = list(image.entrypoint) + (
            list(container.args) if container.args else list(image.cmd)
        )
    return [expand_vars(a, env) for a in argv]


def _mount_prelude(*, mounts: list[tuple[Path, str, bool]], read_only_root: bool) -> list[str]:
    lines = ["set -e"]
    for source, target, read_only in mounts:
        q_src, q_dst = shlex.quote(str(source)), shlex.quote(target)
        if source.is_dir():
            lines.append(f"mkdir -p {q_dst}")
        else:
            lines.append(f"mkdir -p $(dirname {q_dst}) && touch {q_dst}")
        lines.append(f"mount --bind {q_src} {q_dst}")
        if read_only:
            lines.append(f"mount -o remount,bind,ro {q_dst}")
    if read_only_root:
        lines.append("mount -o remount,bind,ro /")
    return lines


@dataclass
class ProbeState:
    spec: Any
    successes: int = 0
    failures: int = 0
    last_run: float = 0.0
    result: bool | None = None


@dataclass
class Container:
    """Runtime state of one container; owned by its pod worker's thread."""

    spec: Any
    image: ImageCommand | None
    restart_count: int = 0
    proc: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    started_mono: float = 0.0
    state: dict[str, Any] = field(
        default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}}
    )
    last_state: dict[str, Any] = field(default_factory=dict)
    ready: bool = False
    started: bool = False
    next_start_after: float = 0.0
    exit_code: int | None = None
    probes: dict[str, ProbeState] = field(default_factory=dict)
    kill_reason: str | None = None

    @property
    def name(self) -> str:
        return str(self.spec.name)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_path(self, pod_dir: Path, *, restart: int | None = None) -> Path:
        n = self.restart_count if restart is None else restart
        return pod_dir / "logs" / self.name / f"{n}.log"

    def start(
        self,
        *,
        pod: Any,
        pod_dir: Path,
        env: dict[str, str],
        volumes: dict[str, HostVolume],
        base_env: dict[str, str],
    ) -> None:
        assert self.image is not None
        argv = build_argv(image=self.image, container=self.spec, env=env)
        if not argv:
            raise ValueError(
                "no command: the image map entry has no entrypoint and the pod sets no command"
            )
        mounts = []
        for vm in self.spec.volume_mounts or []:
            hv = volumes[vm.name]
            source = hv.path / vm.sub_path if vm.sub_path else hv.path
            mounts.append((source, vm.mount_path, bool(vm.read_only) or hv.always_read_only))
        sc = self.spec.security_context
        pod_sc = pod.spec.security_context
        run_as_user = (sc.run_as_user if sc else None) or (pod_sc.run_as_user if pod_sc else None)
        run_as_group = (sc.run_as_group if sc else None) or (
            pod_sc.run_as_group if pod_sc else None
        )
        read_only_root = bool(sc and sc.read_only_root_filesystem)
        lines = _mount_prelude(mounts=mounts, read_only_root=read_only_root)
        workdir = self.spec.working_dir or self.image.working_dir
        if workdir:
            lines.append(f"cd {shlex.quote(workdir)}")
        exec_argv = list(argv)
        if run_as_user is not None:
            exec_argv = [
                "setpriv",
                f"--reuid={run_as_user}",
                f"--regid={run_as_group if run_as_group is not None else run_as_user}",
                f"--groups={pod_sc.fs_group}"
                if pod_sc and pod_sc.fs_group is not None
                else "--clear-groups",
                *(["--no-new-privs"] if sc and sc.allow_privilege_escalation is False else []),
                "--",
                *argv,
            ]
        lines.append('exec "$@"')
        full_env = {**base_env, **dict(self.image.env), **env}
        full_env.setdefault("PATH", BASE_PATH)
        log_path = self.log_path(pod_dir)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    "\n".join(lines),
                    "kama-container",
                    *exec_argv,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.started_at = now_rfc3339()
        self.started_mono = time.monotonic()
        self.state = {"running": {"startedAt": self.started_at}}
        self.ready = False
        self.started = self.spec.startup_probe is None
        self.exit_code = None
        self.kill_reason = None
        self.probes = {
            kind: ProbeState(spec=probe)
            for kind, probe in (
                ("startup", self.spec.startup_probe),
                ("readiness", self.spec.readiness_probe),
                ("liveness", self.spec.liveness_probe),
            )
            if probe is not None
        }

    def reap(self) -> int | None:
        """Exit code once the process has ended (and record the terminated state)."""
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is None:
            return None
        if self.exit_code is None:
            self.exit_code = 128 - code if code < 0 else code  # killed by signal 9 → 137
            reason = self.kill_reason or ("Completed" if self.exit_code == 0 else "Error")
            self.state = {
                "terminated": {
                    "exitCode": self.exit_code,
                    "reason": reason,
                    "startedAt": self.started_at,
                    "finishedAt": now_rfc3339(),
                    "containerID": f"process://{self.proc.pid}",
                }
            }
            self.ready = False
        return self.exit_code

    def signal(self, sig: int) -> None:
        """Signal the container's main process (its PID 1), as a container runtime does;
        SIGKILL goes to the whole process group so nothing the container started survives."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if sig == signal.SIGKILL:
                    os.killpg(self.proc.pid, sig)
                else:
                    os.kill(self.proc.pid, sig)

    def stop(self, *, grace: float, reason: str | None = None) -> None:
        """SIGTERM to the main process, wait up to `grace`, then SIGKILL to everything the
        container started (as a runtime kills the container's cgroup), even when the
        main process already exited and left children behind."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.kill_reason = reason
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=max(grace, 0.0))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.reap()

    # probes -----------------------------------------------------------------

    def run_probes(self, *, pod_ip: str, env: dict[str, str]) -> str | None:
        """Run the probes that are due. Returns 'liveness' or 'startup' when that
        probe crossed its failure threshold and the container must be restarted."""
        if not self.running():
            return None
        now = time.monotonic()
        since_start = now - self.started_mono
        order = ["startup"] if not self.started else ["liveness", "readiness"]
        if not self.started and "readiness" in self.probes:
            self.ready = False
        if self.started and "readiness" not in self.probes:
            self.ready = True
        for kind in order:
            state = self.probes.get(kind)
            if state is None:
                if kind == "startup":
                    self.started = True
                continue
            spec = state.spec
            if since_start < (spec.initial_delay_seconds or 0):
                continue
            if state.last_run and now - state.last_run < (spec.period_seconds or 10):
                continue
            state.last_run = now
            ok = probe_once(
                spec=spec, pod_ip=pod_ip, pid=self.proc.pid if self.proc else 0, env=env
            )
            if ok:
                state.successes += 1
                state.failures = 0
            else:
                state.failures += 1
                state.successes = 0
            success_threshold = spec.success_threshold or 1
            failure_threshold = spec.failure_threshold or 3
            if kind == "startup":
                if ok:
                    self.started = True
                elif state.failures >= failure_threshold:
                    return "startup"
            elif kind == "liveness":
                if not ok and state.failures >= failure_threshold:
                    return "liveness"
            elif kind == "readiness":
                if ok and state.successes >= success_threshold:
                    self.ready = True
                elif not ok and state.failures >= failure_threshold:
                    self.ready = False
        return None


def _port(port: Any, container_ports: dict[str, int] | None = None) -> int:
    if isinstance(port, int):
        return port
    if isinstance(port, str) and port.isdigit():
        return int(port)
    if container_ports and port in container_ports:
        return container_ports[port]
    raise ValueError(f"named port {port!r} not resolvable")


def probe_once(*, spec: Any, pod_ip: str, pid: int, env: dict[str, str]) -> bool:
    timeout = float(spec.timeout_seconds or 1)
    try:
        if spec.http_get is not None:
            hg = spec.http_get
            host = hg.host or pod_ip
            scheme = (hg.scheme or "HTTP").lower()
            url = f"{scheme}://{host}:{_port(hg.port)}{hg.path or '/'}"
            request = urllib.request.Request(
                url, headers={h.name: h.value for h in hg.http_headers or []}
            )
            try:
                with urllib.request.urlopen(request, timeout=timeout) as resp:
                    return 200 <= int(resp.status) < 400
            except urllib.error.HTTPError as exc:
                return 200 <= exc.code < 400
        if spec.tcp_socket is not None:
            with socket.create_connection(
                (spec.tcp_socket.host or pod_ip, _port(spec.tcp_socket.port)), timeout=timeout
            ):
                return True
        if spec._exec is not None:
            argv = ["nsenter", f"--target={pid}", "--mount", "--", *spec._exec.command]
            result = subprocess.run(
                argv,
                env={"PATH": BASE_PATH, **env},
                timeout=timeout,
                capture_output=True,
                check=False,
            )
            return result.returncode == 0
        if spec.grpc is not None:
            with socket.create_connection((pod_ip, int(spec.grpc.port)), timeout=timeout):
                return True
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return False
    return False
