"""KEDA (its operator and its metrics adapter) on the local stack, started on demand.

Kama can hand a deployment's scaling to KEDA; the stack tests prove that against the
real KEDA, not a stand-in. Its two binaries (deploy/local/build-keda.sh builds them from
the Go module) run as host processes like the control plane, with the stack's marker,
so `LocalStack.stop()` and a crash sweep end them too:

- `keda`, the operator: reconciles ScaledObjects into HPAs, polls the scalers, scales
  a target between zero and one itself, and serves the metrics it read over gRPC (mTLS)
  on loopback;
- `keda-adapter`, an extension API server serving `external.metrics.k8s.io`: it asks
  the operator over that gRPC service. The API server reaches it through its
  aggregation layer (kamadev.cluster enables it): an APIService names the selector-less
  Service `keda/keda-metrics-apiserver`, whose hand-made EndpointSlice holds the
  bridge's host address, where the adapter listens (the API server dials endpoint
  addresses, there being no kube-proxy on the host).

KEDA's manifests give both a ServiceAccount and RBAC of their own; here both use the
stack's admin kubeconfig, as a test fixture may. One certificate from the stack's CA
serves the adapter (for the aggregator, `keda-metrics-apiserver.keda.svc`) and both
ends of the gRPC service (`127.0.0.1`); KEDA's own certificate rotation and its
patching of webhooks and the APIService are off. Nothing of this starts with a stack:
only tests that use KEDA pay for it (`LocalKeda(stack).start()`).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kamadev.binaries import KedaBinaries, ensure_keda
from kamadev.cluster import FRONT_PROXY_CLIENT
from kamadev.host_service import host_service
from kamadev.processes import ManagedProcess, free_port
from kamadev.stack import LocalStack

NAMESPACE = "keda"
ADAPTER_SERVICE = "keda-metrics-apiserver"
OPERATOR_SERVICE = "keda-operator"
APISERVICE = "v1beta1.external.metrics.k8s.io"
EXTERNAL_METRICS_API = "/apis/external.metrics.k8s.io/v1beta1"
_READY_TIMEOUT_S = 90.0


class LocalKeda:
    """KEDA's operator and metrics adapter against a started LocalStack."""

    def __init__(self, stack: LocalStack, *, binaries: KedaBinaries | None = None) -> None:
        self.stack = stack
        self.binaries = binaries or ensure_keda()
        self.workdir = stack.workdir / "keda"
        self.operator: ManagedProcess | None = None
        self.adapter: ManagedProcess | None = None
        self.health_url = ""  # the operator's /healthz and /readyz
        self.operator_metrics_url = ""  # the operator's Prometheus metrics
        self.metrics_service_address = ""  # the operator's gRPC metrics service
        self.adapter_address = ""  # host:port where the API server reaches the adapter
        self.startup_seconds = 0.0

    # lifecycle ------------------------------------------------------------------

    def start(self) -> LocalKeda:
        """Install the CRDs, start both processes, register the APIService; returns
        once the operator is ready and the API server answers for the external
        metrics API."""
        started = time.monotonic()
        try:
            self._install_crds()
            certs = self._write_certs()
            self._start_operator(certs)
            self._start_adapter(certs)
            self._register_apiservice()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Delete every ScaledObject and ScaledJob while the operator still runs (it
        removes their finalizers, or their namespaces could never go), unregister the
        APIService (an unavailable one fails every client's discovery, and with it the
        namespace controller), then end both processes."""
        if self.operator is None and self.adapter is None:
            return
        try:
            if self.operator is not None and self.operator.alive():
                self._kubectl(
                    "delete",
                    "scaledobjects.keda.sh,scaledjobs.keda.sh",
                    "--all",
                    "--all-namespaces",
                    "--ignore-not-found",
                    "--timeout=30s",
                    check=False,
                )
            self._kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found", check=False)
        finally:
            for proc in (self.adapter, self.operator):
                if proc is not None:
                    proc.stop(grace=5)
            self.adapter = self.operator = None

    def check_alive(self) -> None:
        for proc in (self.operator, self.adapter):
            if proc is not None:
                proc.check_alive()

    # steps ----------------------------------------------------------------------

    def _install_crds(self) -> None:
        crds = sorted(self.binaries.crds.glob("*.yaml"))
        if not crds:
            raise RuntimeError(
                f"no KEDA CRDs in {self.binaries.crds}: run deploy/local/build-keda.sh"
            )
        self._kubectl("apply", "-f", "-", stdin=json.dumps(_namespace()))
        # server-side: scaledjobs.keda.sh is too large for last-applied-configuration
        args = [arg for crd in crds for arg in ("-f", str(crd))]
        self._kubectl("apply", "--server-side", "--force-conflicts", *args)
        # config/crd/bases names each file <group>_<plural>.yaml
        names = ["crd/{1}.{0}".format(*crd.stem.split("_", 1)) for crd in crds]
        self._kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)

    def _write_certs(self) -> Path:
        """`--cert-dir` of both processes, laid out as KEDA's chart mounts its secret:
        tls.crt and tls.key (server and client use), ca.crt (what each end trusts)."""
        ca = self.stack.cluster.ca
        pair = ca.issue(
            name="keda",
            common_name="keda",
            server=True,
            client=True,
            dns_names=(
                "localhost",
                *(
                    f"{service}.{NAMESPACE}.{suffix}"
                    for service in (ADAPTER_SERVICE, OPERATOR_SERVICE)
                    for suffix in ("svc", "svc.cluster.local")
                ),
            ),
            ip_addresses=("127.0.0.1", self.stack.service_host),
        )
        certs = self.workdir / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pair.cert, certs / "tls.crt")
        shutil.copyfile(pair.key, certs / "tls.key")
        (certs / "tls.key").chmod(0o600)
        shutil.copyfile(ca.pair.cert, certs / "ca.crt")
        # what scalers trust besides the system's roots (never the host's /custom/ca)
        custom_ca = self.workdir / "custom-ca"
        custom_ca.mkdir(exist_ok=True)
        shutil.copyfile(ca.pair.cert, custom_ca / "kama-local-ca.crt")
        return certs

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KUBECONFIG": str(self.stack.kubeconfig),
            "WATCH_NAMESPACE": "",  # every namespace
            "POD_NAMESPACE": NAMESPACE,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
        }

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        return ManagedProcess(
            name=name,
            argv=argv,
            log_path=self.stack.workdir / "logs" / f"{name}.log",
            stack_id=self.stack.stack_id,
            env=self._env(),
            cwd=self.workdir,
        )

    def _start_operator(self, certs: Path) -> None:
        health, metrics, grpc = free_port(), free_port(), free_port()
        self.health_url = f"http://127.0.0.1:{health}"
        self.operator_metrics_url = f"http://127.0.0.1:{metrics}/metrics"
        self.metrics_service_address = f"127.0.0.1:{grpc}"
        self.operator = self._spawn(
            "keda-operator",
            [
                str(self.binaries.operator),
                f"--health-probe-bind-address=127.0.0.1:{health}",
                f"--metrics-bind-address=127.0.0.1:{metrics}",
                f"--metrics-service-bind-address={self.metrics_service_address}",
                f"--cert-dir={certs}",
                f"--ca-dir={self.workdir / 'custom-ca'}",
                "--enable-cert-rotation=false",
                "--enable-webhook-patching=false",
                "--enable-apiservice-patching=false",
                "--leader-elect=false",
                "--zap-log-level=info",
                "--zap-encoder=console",
            ],
        )

    def _start_adapter(self, certs: Path) -> None:
        host = self.stack.service_host
        port = free_port(host=host)
        self.adapter_address = f"{host}:{port}"
        kubeconfig = str(self.stack.kubeconfig)
        front_proxy_ca = self.stack.cluster.endpoints.front_proxy_ca
        assert front_proxy_ca is not None
        self.adapter = self._spawn(
            "keda-adapter",
            [
                str(self.binaries.adapter),
                f"--bind-address={host}",
                f"--secure-port={port}",
                f"--cert-dir={certs}",  # also where its gRPC client finds its certificate
                f"--tls-cert-file={certs / 'tls.crt'}",
                f"--tls-private-key-file={certs / 'tls.key'}",
                f"--client-ca-file={certs / 'ca.crt'}",
                # who may speak for a user: the aggregator, by its front-proxy identity
                f"--requestheader-client-ca-file={front_proxy_ca}",
                f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--lister-kubeconfig={kubeconfig}",
                f"--metrics-service-address={self.metrics_service_address}",
                f"--port={free_port()}",  # its own Prometheus metrics
                "--zap-log-level=info",
                "--zap-encoder=console",
            ],
        )

    def _register_apiservice(self) -> None:
        port = int(self.adapter_address.rsplit(":", 1)[1])
        ca_bundle = base64.b64encode(self.stack.cluster.ca.pair.cert.read_bytes()).decode()
        objects = [
            *host_service(
                namespace=NAMESPACE,
                name=ADAPTER_SERVICE,
                port=443,
                target_port=port,
                address=self.stack.service_host,
                port_name="https",
            ),
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": APISERVICE},
                "spec": {
                    "group": "external.metrics.k8s.io",
                    "version": "v1beta1",
                    "service": {"name": ADAPTER_SERVICE, "namespace": NAMESPACE, "port": 443},
                    "caBundle": ca_bundle,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                },
            },
        ]
        self._kubectl(
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        operator_ready = metrics_api = False
        last = ""
        while time.monotonic() < deadline:
            self.check_alive()
            if not operator_ready:
                operator_ready, last = _http_ok(f"{self.health_url}/readyz")
            elif not metrics_api:
                result = self._kubectl("get", "--raw", EXTERNAL_METRICS_API, check=False)
                metrics_api, last = result.returncode == 0, result.stderr.strip()
            if operator_ready and metrics_api:
                return
            time.sleep(0.3)
        tails = "\n".join(
            f"--- {proc.name}\n{proc.tail()}" for proc in (self.operator, self.adapter) if proc
        )
        raise TimeoutError(
            f"KEDA not ready after {_READY_TIMEOUT_S}s (operator ready: {operator_ready}, "
            f"{EXTERNAL_METRICS_API} served: {metrics_api}; last: {last})\n{tails}"
        )

    def _kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.stack.binaries.kubectl), "--request-timeout=30s", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.stack.kubectl_env(),
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result


def _namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def _http_ok(url: str) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200, f"{url}: HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{url}: HTTP {exc.code}"
    except OSError as exc:
        return False, f"{url}: {exc}"
