"""Session fixtures: the local stack (real apiserver, two real nodes, Temporal) is
started once for all integration tests and torn down at the end; and the suite's lanes
(`pytest_collection_modifyitems`, by `kamadev.suite_lanes`): pure and workflow tests
first, then the stack tests, then the modules that need KEDA (built in the background
meanwhile, `make pytest`), then the disruptive ones (outages, node loss, separate
stacks torn down) serially at the end, so nothing they break can be blamed on a later
test."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from kamadev.binaries import REPO_ROOT, ensure_helm
from kamadev.hub import HubFixture
from kamadev.keda import LocalKeda
from kamadev.processes import ManagedProcess, free_port, processes_with_marker, wait_until
from kamadev.stack import KAMA_IMAGE, KAMA_LLAMA_IMAGE, LocalStack
from kamadev.suite_lanes import suite_lane
from tests.pod_logs import keep_namespace_evidence
from tests.support import eventually, exists, kubectl


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the collected tests by lane, keeping the collection order within a lane
    (a stable sort: module-scoped fixtures still start once per module)."""
    items.sort(key=lambda item: suite_lane(path=item.path.as_posix(), module=item.path.stem))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Each phase's report on its item (`item.stash`), for fixtures that keep evidence
    only when the test failed (`kept_logs`)."""
    report = yield
    item.stash.setdefault(PHASE_REPORTS, {})[call.when] = report
    return report


PHASE_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


def failed(request: pytest.FixtureRequest) -> bool:
    """Whether the test that asked for the fixture failed (its setup or its call)."""
    reports = request.node.stash.get(PHASE_REPORTS, {})
    return not all(report.passed for report in reports.values())


def kept_logs_dir(request: pytest.FixtureRequest) -> Path:
    """`test-results/kept-logs/<test>`: where a failed test's evidence goes."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)
    return REPO_ROOT / "test-results" / "kept-logs" / name


@pytest.fixture
def kept_logs(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A directory for the logs a test follows (`tests.pod_logs`), kept under
    `test-results/kept-logs/<test>` when the test fails and removed when it passes."""
    directory = kept_logs_dir(request)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    yield directory
    if failed(request):
        print(f"\nlogs kept: {directory}")
    else:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def stack() -> Iterator[LocalStack]:
    local = LocalStack().start()
    try:
        yield local
    finally:
        leftovers = local.stop()
        still = processes_with_marker(stack_id=local.stack_id)
        if os.environ.get("KAMA_KEEP_STACK"):
            print(f"\nstack work dir kept: {local.workdir}")
        else:
            local.remove_workdir()
        assert not still, f"processes left after teardown: {still}"
        assert not leftovers, f"teardown had to sweep processes: {leftovers}"


def fresh_namespace(stack: LocalStack, *, prefix: str = "t") -> Iterator[str]:
    """A new namespace with its default service account, deleted afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    kubectl(stack, "create", "namespace", name)
    eventually(
        lambda: exists(stack, "serviceaccount", "default", "-n", name),
        timeout=30,
        what=f"service account default in {name}",
    )
    yield name
    kubectl(stack, "delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(stack: LocalStack, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test; when the test fails, its pods' logs, its events and
    the stack's Kama process logs are kept (`tests.pod_logs.keep_namespace_evidence`)
    before the namespace goes."""
    for name in fresh_namespace(stack):
        yield name
        if failed(request):
            kept = keep_namespace_evidence(stack, namespace=name, into=kept_logs_dir(request))
            print(f"\nlogs kept: {kept}")


@pytest.fixture(scope="session")
def crds(stack: LocalStack) -> LocalStack:
    """Kama's generated CRDs, installed and served."""
    kubectl(stack, "apply", "-f", str(REPO_ROOT / "deploy" / "crds"))
    for plural in ("modelartifacts", "modelcaches", "modeldeployments"):
        kubectl(
            stack, "wait", "--for=condition=Established", f"crd/{plural}.kama.dev", "--timeout=60s"
        )
    eventually(
        lambda: kubectl(stack, "get", "ma,mc,md", "-A", check=False).returncode == 0,
        timeout=30,
        what="Kama's resources in discovery",
    )
    return stack


@pytest.fixture(scope="session")
def hub(stack: LocalStack) -> Iterator[HubFixture]:
    """The local Hugging Face Hub that Kama's importers download from."""
    fixture = HubFixture()
    fixture.start(host=stack.service_host)
    yield fixture
    fixture.stop()


@dataclass
class KamaControl:
    """Kama's worker and watcher running as processes against the local stack."""

    stack: LocalStack
    hub: HubFixture
    env: dict[str, str]
    worker: ManagedProcess
    watcher: ManagedProcess
    second_watcher: ManagedProcess  # two watchers at once must be safe

    def restart_worker(self) -> None:
        self.worker.stop(grace=0)
        self.worker = _kama_process(self.stack, "worker", self.env)

    def kill_worker(self) -> None:
        os.killpg(self.worker.pid, signal.SIGKILL)
        self.worker.popen.wait(timeout=10)


def _kama_process(
    stack: LocalStack,
    command: str,
    env: dict[str, str],
    *,
    name: str | None = None,
    extra_args: list[str] | None = None,
) -> ManagedProcess:
    label = name or command
    return ManagedProcess(
        name=f"kama-{label}",
        argv=[sys.executable, "-m", "kamactl", command, *(extra_args or [])],
        log_path=stack.workdir / "logs" / f"kama-{label}.log",
        stack_id=stack.stack_id,
        # each process its own health and metrics ports (two watchers run at once)
        env={
            **os.environ,
            "KAMA_HEALTH_PORT": str(free_port()),
            "KAMA_METRICS_PORT": str(free_port()),
            "KAMA_TEMPORAL_METRICS_PORT": str(free_port()),
            **env,
        },
        cwd=REPO_ROOT,
    )


def chart_tenant_network_policies() -> str:
    """KAMA_TENANT_NETWORK_POLICIES as the chart renders it for the worker in the
    cluster-wide mode (release `kama`)."""
    with tempfile.TemporaryDirectory() as home:
        rendered = subprocess.run(
            [str(ensure_helm()), "template", "kama", str(REPO_ROOT / "deploy/chart/kama"),
             "--namespace", "kama-system", "--set", "temporal.evaluation.enabled=true",
             "--show-only", "templates/worker.yaml"],
            capture_output=True, text=True, timeout=60, check=True,
            env={"PATH": "/usr/bin:/bin", "HELM_CACHE_HOME": f"{home}/cache",
                 "HELM_CONFIG_HOME": f"{home}/config", "HELM_DATA_HOME": f"{home}/data"},
        ).stdout  # fmt: skip
    worker = yaml.safe_load(rendered)
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    (value,) = [e["value"] for e in container["env"] if e["name"] == "KAMA_TENANT_NETWORK_POLICIES"]
    return str(value)


@pytest.fixture(scope="session")
def kama_control(crds: LocalStack, hub: HubFixture) -> Iterator[KamaControl]:
    stack = crds
    env = {
        "KUBECONFIG": str(stack.kubeconfig),
        "KAMA_TEMPORAL_ADDRESS": stack.temporal.address,
        "KAMA_HF_ENDPOINT": hub.url,
        "KAMA_IMPORTER_IMAGE": KAMA_IMAGE,
        "KAMA_RUNTIME_IMAGE": KAMA_LLAMA_IMAGE,
        "KAMA_CONTROL_QUEUE": f"kama-control-{uuid.uuid4().hex[:6]}",
        # where KEDA (kamadev.keda, on this host) calls the session gateway's scaler
        "KAMA_KEDA_SCALER_ADDRESS": f"127.0.0.1:{free_port()}",
        # the master key of llama-server's API keys (kama/serving_key.py), one per stack:
        # serving pods require their key, which only the worker and gateway derive
        "KAMA_SERVING_KEY": secrets.token_urlsafe(32),
        # this host-process Kama serves every namespace, as the chart's cluster-wide
        # mode does: its worker fences each one it creates pods in with the chart's policies
        "KAMA_TENANT_NETWORK_POLICIES": chart_tenant_network_policies(),
    }
    watcher_env = {k: v for k, v in env.items() if k != "KAMA_SERVING_KEY"}
    control = KamaControl(
        stack=stack,
        hub=hub,
        env=env,
        worker=_kama_process(stack, "worker", env),
        # as in the chart, the watcher never holds the serving key
        watcher=_kama_process(stack, "watcher", watcher_env),
        second_watcher=_kama_process(stack, "watcher", watcher_env, name="watcher-b"),
    )
    try:
        yield control
    finally:
        control.watcher.stop(grace=5)
        control.second_watcher.stop(grace=5)
        control.worker.stop(grace=5)


@dataclass
class GatewayProcess:
    url: str  # the public port
    ops_url: str  # the operational port: /metrics, /healthz, /readyz
    process: ManagedProcess
    control: KamaControl


@pytest.fixture(scope="session")
def gateway(kama_control: KamaControl) -> Iterator[GatewayProcess]:
    """`kama gateway` as a process on free loopback ports, ready once its watches
    listed (its /readyz, on the operational port)."""
    port, ops_port = free_port(), free_port()
    keda_port = kama_control.env["KAMA_KEDA_SCALER_ADDRESS"].rsplit(":", 1)[1]
    process = _kama_process(
        kama_control.stack,
        "gateway",
        # the gateway's own behaviour, without keys: unauthenticated, as configured
        # explicitly (API keys: tests/unit/test_gateway_auth.py, and `make dev`)
        {**kama_control.env, "KAMA_GATEWAY_AUTH": "disabled"},
        name="gateway",
        extra_args=[
            *("--host", "127.0.0.1", "--port", str(port), "--ops-port", str(ops_port)),
            *("--keda-scaler-port", keda_port),
        ],
    )
    url, ops_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{ops_port}"

    def ready() -> bool:
        process.check_alive()
        try:
            return httpx.get(f"{ops_url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, timeout=60, what="the gateway to be ready")
        yield GatewayProcess(url=url, ops_url=ops_url, process=process, control=kama_control)
    finally:
        process.stop(grace=5)


@pytest.fixture
def keyed_gateway(kama_control: KamaControl) -> Iterator[GatewayProcess]:
    """`kama gateway` as the chart runs it by default: every caller needs an API key."""
    port, ops_port = free_port(), free_port()
    process = _kama_process(
        kama_control.stack,
        "gateway",
        {**kama_control.env, "KAMA_GATEWAY_AUTH": "apikey"},
        name=f"gateway-keyed-{uuid.uuid4().hex[:6]}",
        extra_args=["--host", "127.0.0.1", "--port", str(port), "--ops-port", str(ops_port)],
    )

    def ready() -> bool:
        process.check_alive()
        try:
            return httpx.get(f"http://127.0.0.1:{ops_port}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, timeout=60, what="the keyed gateway to be ready")
        yield GatewayProcess(
            url=f"http://127.0.0.1:{port}",
            ops_url=f"http://127.0.0.1:{ops_port}",
            process=process,
            control=kama_control,
        )
    finally:
        process.stop(grace=5)


@pytest.fixture(scope="module")
def local_keda(stack: LocalStack) -> Iterator[LocalKeda]:
    """KEDA's operator and metrics adapter on the session stack (kamadev.keda), for the
    modules that use KEDA only; stopped with their ScaledObjects and APIService gone."""
    keda = LocalKeda(stack).start()
    try:
        yield keda
    finally:
        keda.stop()
