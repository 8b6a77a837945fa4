"""A first request that arrives while Temporal is away still wakes its model: the
gateway keeps trying to start the wake while the request is held, and answers it
soon after Temporal returns (the stack test freezes and kills a real Temporal)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from temporalio.service import RPCError, RPCStatusCode

from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.registry import ModelRegistry
from gateway.wake import Waker
from tests.unit.test_gateway_domain import RecordingHandle, RecordingTemporal, deployment, pod


class AwayTemporal(RecordingTemporal):
    """Fails the first `outage` start calls the way the client does while the server
    is unreachable."""

    def __init__(self, *, outage: int) -> None:
        super().__init__()
        self.outage = outage
        self.attempts = 0

    async def start_workflow(self, *args: Any, id: str, **kwargs: Any) -> RecordingHandle:
        self.attempts += 1
        assert kwargs.get("rpc_timeout") is not None  # a stalled server cannot hold the call
        if self.attempts <= self.outage:
            raise RPCError("http2 error", RPCStatusCode.UNAVAILABLE, b"")
        return await super().start_workflow(*args, id=id, **kwargs)


async def test_the_wake_is_retried_until_temporal_answers(monkeypatch: Any) -> None:
    monkeypatch.setattr("gateway.wake.WAKE_RETRY_START_S", 0.01)
    temporal = AwayTemporal(outage=3)
    registry = ModelRegistry()
    waker = Waker(
        client=temporal,  # type: ignore[arg-type]
        task_queue="q",
        cluster="",
        metrics=GatewayMetrics(),
        registry=registry,
        http=httpx.AsyncClient(),
    )
    registry.apply_deployment("ADDED", deployment("chat"))
    model = registry.resolve("ns/chat")
    assert model is not None
    held = asyncio.create_task(waker.hold_until_ready(model))
    for _ in range(200):
        if temporal.started:
            break
        await asyncio.sleep(0.01)
    assert temporal.attempts == 4 and temporal.started == ["wake/ns/chat"]
    assert not held.done()  # still waiting for its replica, not failed
    registry.apply_pod("ADDED", pod("p0"))
    await asyncio.wait_for(held, timeout=5)
    await asyncio.sleep(0.05)
    assert temporal.signalled == [("wake/ns/chat", "run-1", "replica ready")]


async def test_no_retry_once_nothing_is_held(monkeypatch: Any) -> None:
    monkeypatch.setattr("gateway.wake.WAKE_RETRY_START_S", 0.01)
    temporal = AwayTemporal(outage=10_000)
    registry = ModelRegistry()
    waker = Waker(
        client=temporal,  # type: ignore[arg-type]
        task_queue="q",
        cluster="",
        metrics=GatewayMetrics(),
        registry=registry,
        http=httpx.AsyncClient(),
    )
    obj = deployment("chat")
    obj["spec"]["scaling"]["coldStartTimeout"] = "100ms"
    registry.apply_deployment("ADDED", obj)
    model = registry.resolve("ns/chat")
    assert model is not None
    with pytest.raises(GatewayError) as timeout:
        await waker.hold_until_ready(model)
    assert timeout.value.status == 503
    attempts = temporal.attempts
    await asyncio.sleep(0.2)
    assert temporal.attempts <= attempts + 1  # the loop ended with the last held request
