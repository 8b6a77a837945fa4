"""A real Kubernetes control plane: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager as child processes in a temporary directory; etcd and the
controllers on loopback, the API server on the address its nodes reach.

Clients authenticate with certificates from one throw-away CA; authorization is
`Node,RBAC` as in a production cluster. `LocalCluster.stop` kills everything it
started (and sweeps by marker), so a failing test leaves no process behind. The
aggregation layer is on (with a front-proxy CA of its own), so an extension API server
on the host, KEDA's metrics adapter (kamadev.keda), can serve an APIService.
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from kamadev.binaries import Binaries
from kamadev.pki import CertificateAuthority, CertPair, write_service_account_key
from kamadev.processes import ManagedProcess, free_port, wait_for_port

SERVICE_CIDR = "10.96.0.0/16"
_READY_TIMEOUT_S = 120.0
# the identity the aggregator presents to extension API servers (APIServices), which
# trust it only for this name and only from the front-proxy CA
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass(frozen=True)
class ClusterEndpoints:
    server: str
    kubeconfig: Path
    ca: Path
    kubelet_client: CertPair
    pki_dir: Path
    # the CA of the aggregator's front-proxy client certificate: what an extension API
    # server passes as --requestheader-client-ca-file (with FRONT_PROXY_CLIENT allowed)
    front_proxy_ca: Path | None = None


def write_kubeconfig(*, path: Path, server: str, ca: Path, user: CertPair, name: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "kama-local", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {
                "name": name,
                "user": {"client-certificate": str(user.cert), "client-key": str(user.key)},
            }
        ],
        "contexts": [{"name": "kama-local", "context": {"cluster": "kama-local", "user": name}}],
        "current-context": "kama-local",
    }
    path.write_text(yaml.safe_dump(config))
    return path


class LocalCluster:
    """etcd → kube-apiserver → scheduler → controller-manager, started in that order."""

    def __init__(
        self, *, binaries: Binaries, workdir: Path, stack_id: str, api_address: str = "127.0.0.1"
    ) -> None:
        """`api_address`: where kube-apiserver listens and what it advertises (never
        loopback once nodes join: they reach it at their bridge's host address)."""
        self.binaries = binaries
        self.api_address = api_address
        self.workdir = workdir
        self.stack_id = stack_id
        self.processes: list[ManagedProcess] = []
        self.pki_dir = workdir / "pki"
        self.logs = workdir / "logs"
        self._endpoints: ClusterEndpoints | None = None

    @property
    def endpoints(self) -> ClusterEndpoints:
        if self._endpoints is None:
            raise RuntimeError("cluster not started")
        return self._endpoints

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        proc = ManagedProcess(
            name=name, argv=argv, log_path=self.logs / f"{name}.log", stack_id=self.stack_id
        )
        self.processes.append(proc)
        return proc

    def start(self) -> ClusterEndpoints:
        ca = CertificateAuthority(directory=self.pki_dir)
        sa_key, sa_pub = write_service_account_key(directory=self.pki_dir)
        api_port = free_port(host=self.api_address)
        server = f"https://{self.api_address}:{api_port}"
        serving = ca.issue(
            name="apiserver",
            common_name="kube-apiserver",
            server=True,
            dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ip_addresses=tuple(dict.fromkeys(("127.0.0.1", self.api_address, "10.96.0.1"))),
        )
        admin = ca.issue(
            name="admin", common_name="kama-admin", organization="system:masters", client=True
        )
        kubelet_client = ca.issue(
            name="apiserver-kubelet-client",
            common_name="kube-apiserver-kubelet-client",
            organization="system:masters",
            client=True,
        )
        # the aggregation layer, as kubeadm sets it up: its own CA, so no client
        # certificate of the main CA can assert X-Remote-User to an extension server
        front_proxy_ca = CertificateAuthority(directory=self.pki_dir / "front-proxy")
        front_proxy = front_proxy_ca.issue(
            name="front-proxy-client", common_name=FRONT_PROXY_CLIENT, client=True
        )
        scheduler = ca.issue(name="scheduler", common_name="system:kube-scheduler", client=True)
        manager = ca.issue(
            name="controller-manager", common_name="system:kube-controller-manager", client=True
        )
        kubeconfig = write_kubeconfig(
            path=self.workdir / "admin.kubeconfig",
            server=server,
            ca=ca.pair.cert,
            user=admin,
            name="admin",
        )
        scheduler_kc = write_kubeconfig(
            path=self.pki_dir / "scheduler.kubeconfig",
            server=server,
            ca=ca.pair.cert,
            user=scheduler,
            name="scheduler",
        )
        manager_kc = write_kubeconfig(
            path=self.pki_dir / "controller-manager.kubeconfig",
            server=server,
            ca=ca.pair.cert,
            user=manager,
            name="controller-manager",
        )

        etcd_port, etcd_peer = free_port(), free_port()
        etcd = self._spawn(
            "etcd",
            [
                str(self.binaries.k8s("etcd")),
                "--data-dir",
                str(self.workdir / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{etcd_peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{etcd_peer}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ],
        )
        wait_for_port(host="127.0.0.1", port=etcd_port, timeout=30)
        etcd.check_alive()

        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.k8s("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                f"--bind-address={self.api_address}",
                f"--advertise-address={self.api_address}",
                # the `kubernetes` Service's endpoint: what pods reach the API server at
                "--endpoint-reconciler-type=lease",
                f"--secure-port={api_port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={ca.pair.cert}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-key-file={sa_pub}",
                f"--service-account-signing-key-file={sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                f"--kubelet-certificate-authority={ca.pair.cert}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--requestheader-client-ca-file={front_proxy_ca.pair.cert}",
                f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={front_proxy.cert}",
                f"--proxy-client-key-file={front_proxy.key}",
                # the API server runs on the host without kube-proxy: it dials an
                # APIService's endpoint addresses, never its Service's cluster IP
                "--enable-aggregator-routing=true",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._wait_ready(server=server, ca=ca.pair.cert, user=admin, proc=apiserver)

        common = ["--leader-elect=false", "--bind-address=127.0.0.1", "--v=1"]
        self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.k8s("kube-scheduler")),
                f"--kubeconfig={scheduler_kc}",
                f"--authentication-kubeconfig={scheduler_kc}",
                f"--authorization-kubeconfig={scheduler_kc}",
                f"--secure-port={free_port()}",
                *common,
            ],
        )
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.k8s("kube-controller-manager")),
                f"--kubeconfig={manager_kc}",
                f"--authentication-kubeconfig={manager_kc}",
                f"--authorization-kubeconfig={manager_kc}",
                f"--secure-port={free_port()}",
                f"--service-account-private-key-file={sa_key}",
                f"--root-ca-file={ca.pair.cert}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--node-monitor-grace-period=40s",
                # HPAs (KEDA's) re-read their metrics every 5 s, not every 15 s: a test
                # waits for several such steps
                "--horizontal-pod-autoscaler-sync-period=5s",
                *common,
            ],
        )
        self._endpoints = ClusterEndpoints(
            server=server,
            kubeconfig=kubeconfig,
            ca=ca.pair.cert,
            kubelet_client=kubelet_client,
            pki_dir=self.pki_dir,
            front_proxy_ca=front_proxy_ca.pair.cert,
        )
        self.ca = ca
        self._admin = admin
        return self._endpoints

    def _wait_ready(self, *, server: str, ca: Path, user: CertPair, proc: ManagedProcess) -> None:
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(str(user.cert), str(user.key))
        deadline = time.monotonic() + _READY_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            proc.check_alive()
            try:
                with urllib.request.urlopen(f"{server}/readyz", context=context, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.3)
        raise TimeoutError(
            f"kube-apiserver not ready after {_READY_TIMEOUT_S}s ({last})\n{proc.tail()}"
        )

    def restart(self, name: str, *, down_for: float) -> None:
        """Kill one control-plane process (`etcd`, `kube-apiserver`, …) and start it
        again with the same flags after `down_for` seconds, as an upgrade or a crash
        does; waits until the API server answers again."""
        index = next(i for i, p in enumerate(self.processes) if p.name == name)
        old = self.processes[index]
        old.stop(grace=0)
        time.sleep(down_for)
        self.processes[index] = old.respawn()
        endpoints = self.endpoints
        apiserver = next(p for p in self.processes if p.name == "kube-apiserver")
        self._wait_ready(server=endpoints.server, ca=endpoints.ca, user=self._admin, proc=apiserver)

    def check_alive(self) -> None:
        for proc in self.processes:
            proc.check_alive()

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()
