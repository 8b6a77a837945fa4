"""Session fixtures: the local stack (real apiserver, process node, Temporal) is
started once for all integration tests and torn down at the end."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from localstack.processes import processes_with_marker
from localstack.stack import LocalStack
from tests.support import eventually, kubectl


@pytest.fixture(scope="session")
def stack() -> Iterator[LocalStack]:
    local = LocalStack().start()
    try:
        yield local
    finally:
        leftovers = local.stop()
        still = processes_with_marker(stack_id=local.stack_id)
        local.remove_workdir()
        assert not still, f"processes left after teardown: {still}"
        assert not leftovers, f"teardown had to sweep processes: {leftovers}"


@pytest.fixture
def namespace(stack: LocalStack) -> Iterator[str]:
    """A fresh namespace per test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kubectl(stack, "create", "namespace", name)
    eventually(
        lambda: (
            kubectl(stack, "get", "serviceaccount", "default", "-n", name, check=False).returncode
            == 0
        ),
        timeout=30,
        what=f"service account default in {name}",
    )
    yield name
    kubectl(stack, "delete", "namespace", name, "--wait=false", check=False)
