"""Workflow tests: the import tests run on a real Temporal dev server (no cluster
needed) with the local Hub fixture as the model source; the entity-workflow tests run
on Temporal's time-skipping test server with faked activities (`scenarios.py`)."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from kamadev.binaries import REPO_ROOT
from kamadev.hub import HubFixture
from kamadev.processes import sweep
from kamadev.temporal import TemporalDevServer, TemporalEndpoints
from tests.workflows.time_skipping import TimeSkippingServer
from tests.workflows.time_skipping import time_skipping as time_skipping_server


@pytest.fixture(scope="session")
def temporal_server() -> Iterator[TemporalEndpoints]:
    stack_id = f"wf-{uuid.uuid4().hex[:8]}"
    workdir = Path(tempfile.mkdtemp(prefix="kama-temporal-"))
    server = TemporalDevServer(
        temporal=REPO_ROOT / ".venv" / "bin" / "temporal", workdir=workdir, stack_id=stack_id
    )
    endpoints = server.start()
    try:
        yield endpoints
    finally:
        server.stop()
        sweep(stack_id=stack_id)


@pytest.fixture
async def temporal_client(temporal_server: TemporalEndpoints) -> AsyncIterator[Client]:
    yield await Client.connect(temporal_server.address)


@pytest.fixture
def hub() -> Iterator[HubFixture]:
    fixture = HubFixture()
    fixture.start()
    yield fixture
    fixture.stop()


@pytest.fixture
async def time_skipping() -> AsyncIterator[TimeSkippingServer]:
    """Temporal's time-skipping test server (Java, from Maven Central; see
    deploy/local/build-test-server.sh), one per test (~2 s to start)."""
    async with time_skipping_server() as server:
        yield server
