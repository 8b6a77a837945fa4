"""A first request that arrives while Temporal is away still wakes its model: the
gateway keeps trying to start the wake while the request is held, and answers it
soon after Temporal returns (the stack test freezes and kills a real Temporal).
Time is a `ManualClock`: the retries are asserted at their exact times."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from temporalio.service import RPCError, RPCStatusCode

from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.registry import Model, ModelRegistry
from gateway.wake import WAKE_RETRY_MAX_S, WAKE_RETRY_START_S, Waker
from kama.contracts import WAKE_WORKFLOW, ObjectRef, WakeInput
from tests.unit.gateway_support import (
    ManualClock,
    RecordingHandle,
    RecordingTemporal,
    deployment,
    pod,
)
from workflows.wake import WakeWorkflow


class AwayTemporal(RecordingTemporal):
    """Fails the first `outage` start calls the way the client does while the server
    is unreachable; notes when each attempt came."""

    def __init__(self, *, outage: int, clock: ManualClock) -> None:
        super().__init__()
        self.outage = outage
        self.clock = clock
        self.attempts: list[float] = []
        self.starts: list[tuple[Any, ...]] = []  # what each start asked for

    async def start_workflow(self, *args: Any, id: str, **kwargs: Any) -> RecordingHandle:
        self.attempts.append(self.clock.now())
        self.starts.append(args)
        assert kwargs.get("rpc_timeout") is not None  # a stalled server cannot hold the call
        if len(self.attempts) <= self.outage:
            raise RPCError("http2 error", RPCStatusCode.UNAVAILABLE, b"")
        return await super().start_workflow(*args, id=id, **kwargs)


def away_waker(
    *, outage: int, cold_start: str = "90s"
) -> tuple[Waker, AwayTemporal, ModelRegistry, Model, ManualClock]:
    clock = ManualClock()
    temporal = AwayTemporal(outage=outage, clock=clock)
    registry = ModelRegistry()
    waker = Waker(
        client=temporal,  # type: ignore[arg-type]
        task_queue="q",
        cluster="",
        metrics=GatewayMetrics(),
        registry=registry,
        http=httpx.AsyncClient(),
        clock=clock,
    )
    obj = deployment("chat")
    obj["spec"]["scaling"]["coldStartTimeout"] = cold_start
    registry.apply_deployment("ADDED", obj)
    model = registry.resolve("ns/chat")
    assert model is not None
    return waker, temporal, registry, model, clock


async def test_the_wake_is_retried_until_temporal_answers() -> None:
    waker, temporal, registry, model, clock = away_waker(outage=3)
    arrived = clock.now()
    held = asyncio.create_task(waker.hold_until_ready(model))
    await clock.advance_until(lambda: bool(temporal.started), within=10)
    # capped exponential back-off from the first held request on
    backoffs = [WAKE_RETRY_START_S * 2**n for n in range(3)]
    expected = [arrived + sum(backoffs[:n]) for n in range(4)]
    assert temporal.attempts == pytest.approx(expected)
    assert temporal.started == ["wake/ns/chat"]
    wake = WakeInput(ref=ObjectRef(namespace="ns", name="chat", uid="u1"), timeout_s=90.0)
    assert temporal.starts[-1] == (WAKE_WORKFLOW, wake)
    assert not held.done()  # still waiting for its replica, not failed
    registry.apply_pod("ADDED", pod("p0"))
    await clock.settle()
    assert held.done() and held.exception() is None
    assert temporal.signalled == [("wake/ns/chat", "run-1", "replica ready")]


async def test_the_back_off_is_capped() -> None:
    waker, temporal, _, model, clock = away_waker(outage=10_000)
    held = asyncio.create_task(waker.hold_until_ready(model))
    await clock.advance(60)
    gaps = [b - a for a, b in zip(temporal.attempts, temporal.attempts[1:], strict=False)]
    assert max(gaps) == WAKE_RETRY_MAX_S and gaps[-3:] == [WAKE_RETRY_MAX_S] * 3
    held.cancel()
    await asyncio.gather(held, return_exceptions=True)


async def test_no_retry_once_nothing_is_held() -> None:
    waker, temporal, _, model, clock = away_waker(outage=10_000, cold_start="100ms")
    arrived = clock.now()
    held = asyncio.create_task(waker.hold_until_ready(model))
    await clock.advance_until(held.done, within=1)
    assert clock.now() == pytest.approx(arrived + 0.1), "answered at the cold-start timeout"
    with pytest.raises(GatewayError) as timeout:
        await held
    assert timeout.value.status == 503 and timeout.value.code == "cold_start_timeout"
    attempts = len(temporal.attempts)
    await clock.advance(30)
    assert len(temporal.attempts) <= attempts + 1  # the loop ended with the last held request


def test_the_gateway_starts_the_wake_under_the_name_the_worker_registers() -> None:
    assert getattr(WakeWorkflow, "__temporal_workflow_definition").name == WAKE_WORKFLOW
