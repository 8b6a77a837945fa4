"""The whole local stack in one object: control plane, two real nodes
(kamadev.realnode), Temporal.

Tests use it as a session fixture and `make dev` runs it in the foreground; both
call `stop()` at the end, which also sweeps any process still carrying the
stack's marker.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import utils as k8s_utils

from kamadev.binaries import (
    REPO_ROOT,
    build_images,
    ensure_binaries,
    ensure_node_binaries,
)
from kamadev.cluster import ClusterEndpoints, LocalCluster
from kamadev.fake_nodes import FAKE_NODE_LABEL, now, ready_conditions
from kamadev.gpu_nodes import Published
from kamadev.host_service import host_service
from kamadev.processes import ManagedProcess, free_port, sweep, wait_for_port, wait_until
from kamadev.realnode.network import OctetClaim
from kamadev.realnode.node import NodeImage
from kamadev.realnode.nodes import RealNodes
from kamadev.temporal import TemporalDevServer, TemporalEndpoints

log = logging.getLogger("kamadev")

SHELL_IMAGE = "kama.dev/busybox:dev"  # Debian's busybox-static (deploy/local/build-node.sh)
# Kama's images (deploy/images), imported into every node's containerd under these names
KAMA_IMAGE = "kama.dev/kama:dev"
KAMA_LLAMA_IMAGE = "kama.dev/kama-llama-server:dev"  # serving pods run `kama runtime`
TEMPORAL_DEV_IMAGE = "kama.dev/kama-temporal-dev:dev"  # the chart's evaluation mode
# the host's Temporal dev server as the stack's pods reach it: a Service by name
STACK_NAMESPACE = "kama-system"
TEMPORAL_SERVICE = "temporal"
TEMPORAL_SERVICE_PORT = 7233


@dataclass(frozen=True)
class GPUNode:
    """A fake node with NVIDIA GPUs as GPU Feature Discovery labels them."""

    name: str
    gpus: int
    product: str = "NVIDIA-H100-80GB-HBM3"
    memory_mib: int = 81559
    cpu: str = "64"
    memory: str = "512Gi"
    published: Published | None = None
    """What GFD and the device plugin publish (``kamadev.gpu_nodes``: time-slicing,
    MIG...); None: ``gpus`` whole cards of ``product`` and ``memory_mib``."""


class LocalStack:
    def __init__(
        self, *, workdir: Path | None = None, with_temporal: bool = True, nodes: int = 2
    ) -> None:
        """`nodes`: how many real nodes (kubelet, containerd, kube-proxy; see
        kamadev.realnode) join the control plane."""
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
        self.services: ManagedProcess | None = None  # kamadev.stack_services
        self._cluster: ClusterEndpoints | None = None
        self._temporal: TemporalEndpoints | None = None
        self._relays: list[ManagedProcess] = []
        self._temporal_relay = ""  # host:port of the relay on the bridge
        self._octet = OctetClaim.claim()
        self.nodes = RealNodes(
            count=nodes,
            octet=self._octet.octet,
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
        the host's address on the nodes' bridge."""
        return self.nodes.addresses.gateway

    @property
    def temporal_for_pods(self) -> str:
        """Temporal's address as the stack's pods reach it (importer pods, the chart's
        pods): the `temporal` Service in `kama-system`, whose endpoint is the relay."""
        if not self._temporal_relay:
            return self.temporal.address
        return f"{TEMPORAL_SERVICE}.{STACK_NAMESPACE}.svc.cluster.local:{TEMPORAL_SERVICE_PORT}"

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
            # the API server listens where the nodes (and their pods) reach the host
            self.cluster.api_address = self.nodes.prepare_network()
            if self.with_temporal:
                self._temporal = self.temporal_server.start()
                self._temporal_relay = self._relay("temporal", self._temporal.address)
            self._cluster = self.cluster.start()
            self._start_nodes()
            self._wait_default_service_account()
            if self._temporal_relay:
                self._publish_temporal()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _start_nodes(self) -> None:
        assert self._cluster is not None
        built = build_images()
        images = [
            NodeImage.from_archive(built["kama"].archive).named(KAMA_IMAGE),
            NodeImage.from_archive(built["kama-llama-server"].archive).named(KAMA_LLAMA_IMAGE),
            NodeImage.from_archive(built["kama-temporal-dev"].archive).named(TEMPORAL_DEV_IMAGE),
            NodeImage.from_archive(self.nodes.binaries.images / "busybox.tar").named(SHELL_IMAGE),
        ]
        self.nodes.start(
            api=self.api_client(),
            api_server=self._cluster.server,
            ca=self.cluster.ca,
            images=images,
        )
        self.services = ManagedProcess(
            name="stack-services",
            argv=[
                sys.executable,
                "-m",
                "kamadev.stack_services",
                "--kubeconfig",
                str(self._cluster.kubeconfig),
                "--volumes",
                str(self.workdir / "volumes"),
                *(f"--node={name}" for name in self.nodes.names),
            ],
            log_path=self.workdir / "logs" / "stack-services.log",
            stack_id=self.stack_id,
            cwd=REPO_ROOT,
        )

    def _publish_temporal(self) -> None:
        """The host's Temporal as a Service for pods (kamadev.host_service)."""
        api = self.api_client()
        namespace = {"apiVersion": "v1", "kind": "Namespace"}
        k8s_utils.create_from_dict(api, {**namespace, "metadata": {"name": STACK_NAMESPACE}})
        address, port = self._temporal_relay.rsplit(":", 1)
        for body in host_service(
            namespace=STACK_NAMESPACE,
            name=TEMPORAL_SERVICE,
            port=TEMPORAL_SERVICE_PORT,
            target_port=int(port),
            address=address,
            port_name="grpc",
        ):
            k8s_utils.create_from_dict(api, body)

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
        }
        if spec.published is None:
            labels |= {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": spec.product,
                "nvidia.com/gpu.memory": str(spec.memory_mib),
                "nvidia.com/gpu.count": str(spec.gpus),
            }
        else:
            labels |= spec.published.labels
        try:
            core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=spec.name, labels=labels)))
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
        capacity = {
            "cpu": spec.cpu,
            "memory": spec.memory,
            "pods": "110",
            **(
                {"nvidia.com/gpu": str(spec.gpus)}
                if spec.published is None
                else spec.published.allocatable
            ),
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
        self.nodes.check_alive()
        if self.services is not None:
            self.services.check_alive()

    def stop(self) -> list[int]:
        """Stop everything; returns PIDs that had to be swept (should be empty)."""
        if self.services is not None:
            self.services.stop(grace=15)
            self.services = None
        self.nodes.stop()
        for relay in self._relays:
            relay.stop(grace=2)
        self._relays.clear()
        self.cluster.stop()
        self.temporal_server.stop()
        leftovers = sweep(stack_id=self.stack_id)
        if leftovers:
            log.warning("swept leftover processes: %s", leftovers)
        self._octet.release()
        return leftovers

    def remove_workdir(self) -> None:
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
