"""PID 1 of a real node: runs inside the node's own network and mount namespaces
(`unshare --net --mount --propagation private`, started by `RealNode`) and brings up
containerd, the kubelet and kube-proxy there, like the init of a kind node container.

In order: private directories over the fixed paths (`/var/lib/kubelet`,
`/run/containerd`, ...) so two nodes never share one; wait until the host has wired the
node's `eth0`; the node's own sysctls; containerd, with the stack's images imported
(nothing is ever pulled); then the kubelet and kube-proxy. It stays as their
supervisor: when one of them exits the node exits too (the stack notices), and on
SIGTERM it stops them and kills every runc shim it adopted. SIGUSR1 kills the kubelet
alone (a crashed kubelet: the node's containers run on, the control plane loses the
node) and SIGUSR2 starts it again. The host puts it in the
node's `system` cgroup before it starts anything, so the node's cgroup root holds
every process of the node: the host empties and removes it after init exits, or
after a crash of the whole stack.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kamadev.processes import die_with_parent

_PR_SET_CHILD_SUBREAPER = 36
_NETWORK_TIMEOUT_S = 60.0
_SOCKET_TIMEOUT_S = 60.0
_STOP_GRACE_S = 10.0
NETWORK_READY = "network.ready"
# what the host sends to simulate a kubelet crash, and to bring the kubelet back
KUBELET_KILL = signal.SIGUSR1
KUBELET_START = signal.SIGUSR2


@dataclass(frozen=True)
class InitConfig:
    name: str
    directory: Path
    node_bin: Path
    node_ip: str
    cgroup_root: str
    private_dirs: dict[str, Path]
    images: list[tuple[str, str, Path]]  # (reference, the archive's own name, oci-archive)

    @classmethod
    def load(cls, path: Path) -> InitConfig:
        raw = json.loads(path.read_text())
        return cls(
            name=raw["name"],
            directory=Path(raw["directory"]),
            node_bin=Path(raw["node_bin"]),
            node_ip=raw["node_ip"],
            cgroup_root=raw["cgroup_root"],
            private_dirs={k: Path(v) for k, v in raw["private_dirs"].items()},
            images=[(ref, own, Path(archive)) for ref, own, archive in raw["images"]],
        )

    def dump(self, path: Path) -> None:
        path.write_text(
            json.dumps(
                {
                    "name": self.name,
                    "directory": str(self.directory),
                    "node_bin": str(self.node_bin),
                    "node_ip": self.node_ip,
                    "cgroup_root": self.cgroup_root,
                    "private_dirs": {k: str(v) for k, v in self.private_dirs.items()},
                    "images": [[ref, own, str(archive)] for ref, own, archive in self.images],
                },
                indent=2,
            )
        )


def log(message: str) -> None:
    print(f"[node-init {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(*argv: str | Path) -> None:
    subprocess.run([str(a) for a in argv], check=True)


def mount_private_dirs(config: InitConfig) -> None:
    """Fresh tmpfs over /run, /var/lib and /var/log (only in this mount namespace),
    then the node's own directories bound onto the fixed paths inside them."""
    for top in ("/run", "/var/lib", "/var/log"):
        run("mount", "-t", "tmpfs", "-o", "mode=755", f"kama-{config.name}", top)
    for fixed, own in config.private_dirs.items():
        own.mkdir(parents=True, exist_ok=True)
        Path(fixed).mkdir(parents=True, exist_ok=True)
        run("mount", "--bind", own, fixed)


def wait_for_network(config: InitConfig) -> None:
    ready = config.directory / NETWORK_READY
    deadline = time.monotonic() + _NETWORK_TIMEOUT_S
    while not ready.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the host did not wire {config.name}'s eth0")
        time.sleep(0.05)


def set_sysctls() -> None:
    # both are this network namespace's own: the host's stay as they are
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
    Path("/proc/sys/net/bridge/bridge-nf-call-iptables").write_text("1")


class Children:
    """The node's daemons, each with its log file, stopped in reverse order."""

    def __init__(self, config: InitConfig) -> None:
        self.config = config
        self.running: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []
        self.argv: dict[str, list[str]] = {}
        self.env = {
            **os.environ,
            "PATH": f"{config.node_bin}:/usr/sbin:/usr/bin:/sbin:/bin",
        }

    def start(self, name: str, argv: list[str]) -> None:
        logs = self.config.directory / "logs"
        logs.mkdir(exist_ok=True)
        out = (logs / f"{name}.log").open("ab")
        self.argv[name] = argv
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=self.env,
            preexec_fn=die_with_parent,  # a killed init takes its daemons along
        )
        self.running.append((name, proc, out))
        log(f"{name} started (pid {proc.pid})")

    def kill(self, name: str) -> None:
        """SIGKILL one daemon, as a crash does; the node runs on without it."""
        for entry in list(self.running):
            if entry[0] == name:
                entry[1].kill()
                entry[1].wait()
                entry[2].close()
                self.running.remove(entry)
                log(f"{name} killed")

    def revive(self, name: str) -> None:
        if not any(entry[0] == name for entry in self.running):
            self.start(name, self.argv[name])

    def exited(self) -> str | None:
        for name, proc, _ in self.running:
            if proc.poll() is not None:
                return f"{name} exited with {proc.returncode}"
        return None

    def stop(self) -> None:
        for name, proc, out in reversed(self.running):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            out.close()
            log(f"{name} stopped")
        self.running.clear()


def wait_for_socket(path: Path, children: Children) -> None:
    deadline = time.monotonic() + _SOCKET_TIMEOUT_S
    while not path.exists():
        problem = children.exited()
        if problem:
            raise RuntimeError(problem)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.05)


def import_images(config: InitConfig, children: Children) -> None:
    """Import each archive under the name its index gives it, then tag it as the
    stack refers to it (`--index-name` would leave the archive's own name to expire
    and, where both are the same, garbage-collect the image the kubelet needs)."""
    ctr = [str(config.node_bin / "ctr"), "-n", "k8s.io"]
    for ref, own, archive in config.images:
        started = time.monotonic()
        subprocess.run(
            [*ctr, "images", "import", str(archive)],
            check=True,
            stdout=subprocess.DEVNULL,
            env=children.env,
        )
        if ref != own:
            subprocess.run(
                [*ctr, "images", "tag", "--force", own, ref],
                check=True,
                stdout=subprocess.DEVNULL,
                env=children.env,
            )
        log(f"imported {ref} in {time.monotonic() - started:.1f}s")


def adopted_children() -> list[int]:
    """Processes reparented to this subreaper (containerd's runc shims)."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:
            found.append(int(entry.name))
    return found


def reap_adopted(children: Children) -> None:
    """Collect shims that exited (never the daemons: their Popen objects do that)."""
    own = {proc.pid for _, proc, _ in children.running}
    for pid in adopted_children():
        if pid not in own:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def main(argv: list[str]) -> int:
    config = InitConfig.load(Path(argv[0]))
    ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    stopping = False
    kubelet_wanted: bool | None = None  # SIGUSR1: kill the kubelet, SIGUSR2: start it again

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    def on_kubelet(signum: int, frame: object) -> None:
        nonlocal kubelet_wanted
        kubelet_wanted = signum == KUBELET_START

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(KUBELET_KILL, on_kubelet)
    signal.signal(KUBELET_START, on_kubelet)
    children = Children(config)
    status = 0
    try:
        mount_private_dirs(config)
        wait_for_network(config)
        set_sysctls()
        conf = config.directory / "conf"
        children.start(
            "containerd",
            [str(config.node_bin / "containerd"), "--config", str(conf / "containerd.toml")],
        )
        wait_for_socket(Path("/run/containerd/containerd.sock"), children)
        import_images(config, children)
        children.start(
            "kubelet",
            [
                str(config.node_bin / "kubelet"),
                f"--config={conf / 'kubelet.yaml'}",
                f"--kubeconfig={conf / 'kubelet.kubeconfig'}",
                f"--hostname-override={config.name}",
                f"--node-ip={config.node_ip}",
                "--v=1",
            ],
        )
        children.start(
            "kube-proxy",
            [str(config.node_bin / "kube-proxy"), f"--config={conf / 'kube-proxy.yaml'}", "--v=1"],
        )
        log("node up")
        while not stopping:
            if kubelet_wanted is not None:
                wanted, kubelet_wanted = kubelet_wanted, None
                if wanted:
                    children.revive("kubelet")
                else:
                    children.kill("kubelet")
            problem = children.exited()
            if problem:
                log(problem)
                status = 1
                break
            reap_adopted(children)
            time.sleep(0.5)
    except Exception as exc:  # the stack reads this from the node's log
        log(f"node failed: {exc!r}")
        status = 1
    finally:
        children.stop()
        # the containers themselves are killed by the host, with the node's cgroups
        for pid in adopted_children():
            os.kill(pid, signal.SIGKILL)
        log("node down")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
