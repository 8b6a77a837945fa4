"""Node registration, heartbeats, the pod watch, the local-path provisioner
(kamadev.provisioner) and the kubelet's HTTPS endpoint (for `kubectl logs`)."""

from __future__ import annotations

import logging
import os
import shutil
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch

from kamadev.fake_nodes import heartbeat_loop, now, ready_conditions
from kamadev.processes import STACK_ID_ENV
from kamadev.processnode.config import ImageMap, NodeConfig
from kamadev.processnode.events import EventRecorder
from kamadev.processnode.pods import PodWorker
from kamadev.provisioner import LocalPathProvisioner

log = logging.getLogger("processnode")


def _meminfo_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


class ProcessNode:
    def __init__(self, *, config: NodeConfig) -> None:
        self.config = config
        api_client = k8s_config.new_client_from_config(config_file=config.kubeconfig)
        self.core = k8s.CoreV1Api(api_client)
        self.coordination = k8s.CoordinationV1Api(api_client)
        self.provisioner = LocalPathProvisioner(
            core=self.core,
            storage=k8s.StorageV1Api(api_client),
            root=Path(config.data_dir) / "volumes",
            nodes=lambda: [config.node_name],
        )
        self.images = ImageMap.load(Path(config.image_map))
        self.events = EventRecorder(core=self.core, node_name=config.node_name)
        self.workers: dict[str, PodWorker] = {}
        self._workers_lock = threading.Lock()
        self._stop = threading.Event()
        self._next_ip = 2
        self._server: ThreadingHTTPServer | None = None
        self.base_env = {
            STACK_ID_ENV: config.stack_id,
            "KUBERNETES_SERVICE_HOST": config.api_host,
            "KUBERNETES_SERVICE_PORT": str(config.api_port),
            "HOME": "/tmp",
        }

    # registration -------------------------------------------------------------

    def register(self) -> None:
        name = self.config.node_name
        cpu = os.cpu_count() or 1
        memory = _meminfo_bytes()
        disk = shutil.disk_usage(self.config.data_dir).total
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "kama.dev/process-node": "true",
            **self.config.labels,
        }
        body = k8s.V1Node(metadata=k8s.V1ObjectMeta(name=name, labels=labels))
        try:
            self.core.create_node(body)
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
            self.core.patch_node(name, {"metadata": {"labels": labels}})
        capacity = {
            "cpu": str(cpu),
            "memory": str(memory),
            "pods": "110",
            "ephemeral-storage": str(disk),
        }
        status = {
            "capacity": capacity,
            "allocatable": {**capacity, "memory": str(max(memory - 256 * 1024 * 1024, 0))},
            "conditions": ready_conditions(now()),
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.config.kubelet_port}},
            "nodeInfo": {
                "machineID": "kama-local",
                "systemUUID": "kama-local",
                "bootID": str(os.getpid()),
                "kernelVersion": os.uname().release,
                "osImage": "Kama process node",
                "containerRuntimeVersion": "process://1",
                "kubeletVersion": "v1.37.2",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
        self.core.patch_node_status(name, {"status": status})
        self.provisioner.ensure_storage_class()

    # heartbeats ---------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        heartbeat_loop(
            core=self.core,
            coordination=self.coordination,
            own=[self.config.node_name],
            stop=self._stop,
        )

    # pods -----------------------------------------------------------------------

    def _allocate_ip(self) -> str:
        n = self._next_ip
        self._next_ip += 1
        return f"{self.config.pod_ip_prefix}.{n // 250}.{n % 250 + 2}"

    def _on_pod(self, pod: Any) -> None:
        uid = pod.metadata.uid
        with self._workers_lock:
            worker = self.workers.get(uid)
            if worker is None:
                worker = PodWorker(
                    pod=pod,
                    core=self.core,
                    config=self.config,
                    images=self.images,
                    pod_ip=self._allocate_ip(),
                    events=self.events,
                    base_env=self.base_env,
                )
                self.workers[uid] = worker
                worker.thread.start()
            else:
                worker.update(pod)

    def _on_pod_deleted(self, uid: str) -> None:
        with self._workers_lock:
            worker = self.workers.pop(uid, None)
        if worker is not None:
            worker.gone()

    def _watch_pods(self) -> None:
        selector = f"spec.nodeName={self.config.node_name}"
        while not self._stop.is_set():
            try:
                listing = self.core.list_pod_for_all_namespaces(field_selector=selector)
                present = {p.metadata.uid for p in listing.items}
                for pod in listing.items:
                    self._on_pod(pod)
                with self._workers_lock:
                    missing = [uid for uid in self.workers if uid not in present]
                for uid in missing:
                    self._on_pod_deleted(uid)
                version = listing.metadata.resource_version
                while not self._stop.is_set():
                    stream = k8s_watch.Watch().stream(
                        self.core.list_pod_for_all_namespaces,
                        field_selector=selector,
                        resource_version=version,
                        timeout_seconds=30,
                        allow_watch_bookmarks=True,
                    )
                    for event in stream:
                        kind, obj = event["type"], event["object"]
                        raw = event.get("raw_object") or {}
                        if kind == "ERROR":
                            raise k8s.ApiException(status=int(raw.get("code", 500)))
                        if kind == "BOOKMARK":
                            version = raw.get("metadata", {}).get("resourceVersion", version)
                            continue
                        version = obj.metadata.resource_version
                        if kind == "DELETED":
                            self._on_pod_deleted(obj.metadata.uid)
                        else:
                            self._on_pod(obj)
            except k8s.ApiException as exc:
                if exc.status != 410:
                    log.warning("pod watch failed (%s); re-listing", exc.status)
                    time.sleep(1)
            except Exception as exc:
                log.warning("pod watch failed (%s); re-listing", exc)
                time.sleep(1)

    def find_worker(self, namespace: str, name: str) -> PodWorker | None:
        with self._workers_lock:
            return next(
                (w for w in self.workers.values() if w.namespace == namespace and w.name == name),
                None,
            )

    # kubelet endpoint -----------------------------------------------------------

    def _serve_kubelet(self) -> None:
        node = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                log.debug(format, *args)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                if url.path == "/healthz":
                    self._send(200, b"ok")
                    return
                if len(parts) == 4 and parts[0] == "containerLogs":
                    node._container_logs(self, parts[1], parts[2], parts[3], parse_qs(url.query))
                    return
                self._send(404, b"not found")

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = ThreadingHTTPServer(("127.0.0.1", self.config.kubelet_port), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.config.kubelet_cert, self.config.kubelet_key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        server.daemon_threads = True
        self._server = server
        server.serve_forever()

    def _container_logs(
        self, handler: Any, ns: str, pod: str, container: str, query: dict[str, list[str]]
    ) -> None:
        worker = self.find_worker(ns, pod)
        target = worker.find(container) if worker else None
        if worker is None or target is None:
            handler._send(
                404, f"container {container} of pod {ns}/{pod} not found on this node".encode()
            )
            return
        previous = query.get("previous", ["false"])[0] == "true"
        restart = target.restart_count - 1 if previous else target.restart_count
        path = target.log_path(worker.pod_dir, restart=restart)
        if restart < 0 or not path.exists():
            handler._send(
                400,
                f'previous terminated container "{container}" in pod "{pod}" not found'.encode(),
            )
            return
        data = path.read_bytes()
        tail = query.get("tailLines")
        if tail:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(tail[0]) :]) if int(tail[0]) > 0 else b""
        limit = query.get("limitBytes")
        if limit:
            data = data[: int(limit[0])]
        follow = query.get("follow", ["false"])[0] == "true" and not previous
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        if not follow:
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
            return
        handler.end_headers()
        handler.wfile.write(data)
        offset = path.stat().st_size
        try:
            while target.running() and not self._stop.is_set():
                time.sleep(0.2)
                size = path.stat().st_size
                if size > offset:
                    with path.open("rb") as f:
                        f.seek(offset)
                        handler.wfile.write(f.read(size - offset))
                        handler.wfile.flush()
                    offset = size
        except (BrokenPipeError, ConnectionResetError):
            return

    # lifecycle --------------------------------------------------------------------

    def run(self) -> None:
        Path(self.config.data_dir).mkdir(parents=True, exist_ok=True)
        self.register()
        for target, name in (
            (self._serve_kubelet, "kubelet-https"),
            (self._heartbeat_loop, "heartbeat"),
            (lambda: self.provisioner.run(self._stop), "provisioner"),
        ):
            threading.Thread(target=target, name=name, daemon=True).start()
        log.info("process node %s ready", self.config.node_name)
        self._watch_pods()

    def stop(self) -> None:
        self._stop.set()
        with self._workers_lock:
            workers = list(self.workers.values())
        for worker in workers:
            for c in worker.all_containers():
                c.stop(grace=2.0)
        if self._server is not None:
            self._server.shutdown()
