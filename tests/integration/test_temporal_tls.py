"""Kama's processes reach Temporal like any Temporal app: through `TEMPORAL_*`
variables, here with mutual TLS to a dev server behind an mTLS front with
certificates of a throw-away CA (the stack's `kamadev.pki`). At start-up each process
checks the namespace's search attributes; a namespace without them stops the process
with the command that creates them, and that command works."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import (
    RegisterNamespaceRequest,
)
from temporalio.client import Client

from kama.config import Settings
from kamactl.clients import connect_temporal
from kamactl.errors import TemporalSetupError
from kamadev.binaries import REPO_ROOT, ensure_binaries
from kamadev.pki import CertificateAuthority
from kamadev.temporal import DevServerTLS, TemporalDevServer

EX_CONFIG = 78
T = TypeVar("T")


@dataclass(frozen=True)
class TlsTemporal:
    address: str
    plain_address: str
    env: dict[str, str]  # TEMPORAL_* with the client certificate
    temporal_cli: Path
    workdir: Path
    stack_id: str


@pytest.fixture(scope="module")
def tls_temporal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsTemporal]:
    workdir = tmp_path_factory.mktemp("temporal-tls")
    ca = CertificateAuthority(directory=workdir / "pki")
    server = ca.issue(
        name="temporal-frontend",
        common_name="temporal-frontend",
        server=True,
        dns_names=("localhost",),
        ip_addresses=("127.0.0.1",),
    )
    client = ca.issue(name="kama", common_name="kama", client=True)
    binaries = ensure_binaries()
    stack_id = f"tls{uuid.uuid4().hex[:9]}"
    dev = TemporalDevServer(
        temporal=binaries.temporal,
        workdir=workdir / "temporal",
        stack_id=stack_id,
        tls=DevServerTLS(cert=server.cert, key=server.key, client_ca=ca.pair.cert),
    )
    endpoints = dev.start()
    try:
        yield TlsTemporal(
            address=endpoints.address,
            plain_address=endpoints.plain_address,
            env={
                "TEMPORAL_ADDRESS": endpoints.address,
                "TEMPORAL_NAMESPACE": "default",
                "TEMPORAL_TLS": "true",
                "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(ca.pair.cert),
                "TEMPORAL_TLS_CLIENT_CERT_PATH": str(client.cert),
                "TEMPORAL_TLS_CLIENT_KEY_PATH": str(client.key),
            },
            temporal_cli=binaries.temporal,
            workdir=workdir,
            stack_id=stack_id,
        )
    finally:
        dev.stop()


def _process_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment without any Temporal setting of its own, plus `extra`."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TEMPORAL_", "KAMA_TEMPORAL_", "KAMA_CLUSTER"))
    }
    return {**base, "TEMPORAL_CONFIG_FILE": "/nonexistent/temporal.toml", **extra}


async def _new_namespace(client: Client) -> str:
    name = f"bare-{uuid.uuid4().hex[:6]}"
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=name, workflow_execution_retention_period=Duration(seconds=86400)
        )
    )
    return name


async def test_only_a_client_with_a_certificate_gets_in(tls_temporal: TlsTemporal) -> None:
    client = await connect_temporal(Settings(), env=tls_temporal.env)
    assert client.namespace == "default"
    no_cert = {k: v for k, v in tls_temporal.env.items() if not k.startswith("TEMPORAL_TLS_CLIENT")}
    with pytest.raises(RuntimeError):
        await connect_temporal(Settings(), env=no_cert)
    with pytest.raises(RuntimeError):  # plain gRPC to the TLS port
        await Client.connect(tls_temporal.address)


async def test_a_namespace_without_kamas_search_attributes_stops_the_process_with_the_fix(
    tls_temporal: TlsTemporal,
) -> None:
    admin = await connect_temporal(Settings(), env=tls_temporal.env)
    namespace = await _new_namespace(admin)
    env = {**tls_temporal.env, "TEMPORAL_NAMESPACE": namespace}

    with pytest.raises(TemporalSetupError) as raised:
        await connect_temporal(Settings(), env=env)
    assert "KamaKind (Keyword) is missing" in str(raised.value)

    run = subprocess.run(
        [sys.executable, "-m", "kamactl", "worker"],
        env=_process_env(env),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == EX_CONFIG, run.stderr
    fix = [
        line.strip()
        for line in run.stderr.splitlines()
        if line.strip().startswith("temporal operator search-attribute create")
    ]
    assert fix == [
        f"temporal operator search-attribute create --namespace {namespace} "
        f"--name {name} --type Keyword"
        for name in ("KamaKind", "KamaNamespace", "KamaName")
    ], run.stderr

    # the fix, as printed, run with the same TEMPORAL_* settings by the temporal CLI
    for command in fix:
        created = subprocess.run(
            [str(tls_temporal.temporal_cli), *shlex.split(command)[1:]],
            env=_process_env(env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert created.returncode == 0, created.stderr

    async def ready() -> bool | None:
        try:
            await connect_temporal(Settings(), env=env)
        except TemporalSetupError:
            return None
        return True

    await eventually_async(ready, what="the namespace to have Kama's search attributes")


async def eventually_async(
    check: Callable[[], Awaitable[T | None]], *, what: str, timeout: float = 60
) -> T:
    """`tests.support.eventually` for a coroutine function: its first truthy result."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)
