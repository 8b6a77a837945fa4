"""KEDA's external scaler as KEDA sees it: the real grpc.aio server on a loopback port
over a fake demand source, called through a real channel with the generated stub
(activity, the metric spec from `scalerMetadata`, the metric, errors, and a stream
that hears a rise at once); and the gateway's demand source, the larger of its own
count and the workflow's sum over every gateway, alone when Temporal is away."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gateway.demand import local_demand
from gateway.keda import externalscaler_pb2 as pb
from gateway.keda import externalscaler_pb2_grpc
from gateway.keda_demand import QUERY_CACHE_S, GatewayDemandSource
from gateway.keda_scaler import (
    METRIC_NAME,
    STREAM_RECHECK_S,
    KedaExternalScaler,
    serve_keda_scaler,
    stop_keda_scaler,
)
from gateway.registry import ModelRegistry
from kama.contracts import STATUS_QUERY, DeploymentWorkflowStatus, ObjectRef, deployment_workflow_id
from kamadev.processes import free_port
from tests.unit.gateway_support import ManualClock, deployment, pod


@dataclass
class FakeSource:
    """Demand per `namespace/name`; a model not in `demands` is unknown."""

    demands: dict[str, int] = field(default_factory=dict)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    asked_for_rise: int = 0  # a stream asks just before it waits for one

    async def demand(self, *, namespace: str, name: str) -> int | None:
        return self.demands.get(f"{namespace}/{name}")

    def rose(self) -> asyncio.Event:
        self.asked_for_rise += 1
        return self.event


@dataclass
class Served:
    source: FakeSource
    stub: Any  # the generated stub is untyped
    clock: ManualClock  # the scaler's: its stream's rechecks wait on it


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    source = FakeSource(demands={"ns/chat": 0})
    clock = ManualClock()
    port = free_port()
    server = await serve_keda_scaler(
        scaler=KedaExternalScaler(source=source, clock=clock), host="127.0.0.1", port=port
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = externalscaler_pb2_grpc.ExternalScalerStub(channel)
            yield Served(source=source, stub=stub, clock=clock)
    finally:
        await stop_keda_scaler(server, grace_s=0.1)


def ref(name: str = "chat", **metadata: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=name, namespace="ns", scalerMetadata=metadata)


async def test_a_model_is_active_while_it_has_demand(served: Served) -> None:
    answer = await served.stub.IsActive(ref(), timeout=5)
    assert answer.result is False
    served.source.demands["ns/chat"] = 3
    answer = await served.stub.IsActive(ref(), timeout=5)
    assert answer.result is True


async def test_metadata_may_name_another_deployment(served: Served) -> None:
    served.source.demands["team/big"] = 1
    answer = await served.stub.IsActive(ref("so", namespace="team", deployment="big"), timeout=5)
    assert answer.result is True


async def test_the_metric_spec_targets_the_demand_per_replica(served: Served) -> None:
    answer = await served.stub.GetMetricSpec(ref(targetPerReplica="2.4"), timeout=5)
    [spec] = answer.metricSpecs
    assert (spec.metricName, spec.targetSize, spec.targetSizeFloat) == (METRIC_NAME, 3, 2.4)


@pytest.mark.parametrize("metadata", [{}, {"targetPerReplica": "lots"}, {"targetPerReplica": "0"}])
async def test_a_missing_or_invalid_target_is_an_invalid_argument(
    served: Served, metadata: dict[str, str]
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await served.stub.GetMetricSpec(ref(**metadata), timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "targetPerReplica" in str(caught.value.details())


async def test_the_metric_is_the_demand_now(served: Served) -> None:
    served.source.demands["ns/chat"] = 7
    request = pb.GetMetricsRequest(scaledObjectRef=ref(), metricName=METRIC_NAME)
    answer = await served.stub.GetMetrics(request, timeout=5)
    [value] = answer.metricValues
    assert (value.metricName, value.metricValue, value.metricValueFloat) == (METRIC_NAME, 7, 7.0)


async def test_an_unknown_model_is_not_found(served: Served) -> None:
    for call in (
        served.stub.IsActive(ref("nope"), timeout=5),
        served.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref("nope")), timeout=5),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert "ns/nope" in str(caught.value.details())


async def test_the_stream_answers_at_once_and_hears_a_rise_at_once(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """The scaler's clock never moves here, so its rechecks (every STREAM_RECHECK_S on
    that clock) never come: the first answer and the one after the rise can only come
    at once, and a stream that waited for a recheck instead fails the read's wait."""
    caplog.set_level(logging.DEBUG, logger="kama.gateway")
    stream = served.stub.StreamIsActive(ref(), timeout=30)
    first = await asyncio.wait_for(stream.read(), timeout=STREAM_RECHECK_S)
    assert first.result is False
    # the stream waits for a rise now (it asks for the flag just before it waits)
    await until_true(lambda: served.source.asked_for_rise > 0)
    served.source.demands["ns/chat"] = 1  # e.g. a request held at zero
    served.source.event.set()
    second = await asyncio.wait_for(stream.read(), timeout=STREAM_RECHECK_S)
    assert second.result is True
    stream.cancel()  # KEDA goes away: the server's stream ends (not at the next recheck)
    await until_true(lambda: "KEDA stream for ns/chat ended" in caplog.text)


async def until_true(check: Callable[[], bool], *, within: float = 2.0) -> None:
    try:
        async with asyncio.timeout(within):
            while not check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {within} s") from None


async def test_the_stream_of_an_unknown_model_ends_not_found(served: Served) -> None:
    stream = served.stub.StreamIsActive(ref("nope"), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stream.read()
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


# the gateway's demand source ---------------------------------------------------------


class FakeTemporal:
    """Stands in for the Temporal client: answers each deployment workflow's `status`
    query with `demand`, or raises `error`; counts the queries."""

    def __init__(self, *, demand: int = 0, error: Exception | None = None) -> None:
        self.demand, self.error = demand, error
        self.queries: list[str] = []

    def get_workflow_handle(self, workflow_id: str) -> FakeTemporal.Handle:
        return FakeTemporal.Handle(self, workflow_id)

    @dataclass
    class Handle:
        temporal: FakeTemporal
        workflow_id: str

        async def query(self, query: str, **kwargs: Any) -> DeploymentWorkflowStatus:
            assert query == STATUS_QUERY and kwargs["result_type"] is DeploymentWorkflowStatus
            self.temporal.queries.append(self.workflow_id)
            if self.temporal.error is not None:
                raise self.temporal.error
            return DeploymentWorkflowStatus(demand=self.temporal.demand)


def gateway_source(
    temporal: FakeTemporal,
) -> tuple[GatewayDemandSource, ModelRegistry, ManualClock]:
    registry = ModelRegistry()
    registry.apply_deployment("ADDED", deployment("chat"))
    registry.apply_pod("ADDED", pod("p0", ip="10.0.0.1", slots=4))
    clock = ManualClock()
    source = GatewayDemandSource(
        registry=registry, client=cast(Client, temporal), cluster="c1", clock=clock
    )
    return source, registry, clock


async def test_the_demand_is_the_larger_of_this_gateways_and_every_gateways() -> None:
    temporal = FakeTemporal(demand=5)
    source, registry, clock = gateway_source(temporal)
    model = registry.models["ns/chat"]
    assert await source.demand(namespace="ns", name="chat") == 5  # other gateways' load
    expected = deployment_workflow_id(
        ObjectRef(namespace="ns", name="chat", uid="u1", cluster="c1")
    )
    assert temporal.queries == [expected]

    leases = [registry.acquire(model, route="chat", exclude=(), now=0.0) for _ in range(2)]
    model.held = 5  # queued here: more than the workflow has heard of yet
    assert local_demand(model) == 7
    assert await source.demand(namespace="ns", name="chat") == 7
    assert len(temporal.queries) == 1, "answered from the cache within QUERY_CACHE_S"
    assert model.requests_since_report == 2, "reading demand leaves the reporter's count"

    model.held = 0
    for lease in leases:
        assert lease is not None
        lease.release()
    temporal.demand = 3
    await clock.advance(QUERY_CACHE_S)
    assert await source.demand(namespace="ns", name="chat") == 3
    assert len(temporal.queries) == 2
    assert await source.demand(namespace="ns", name="other") is None
    assert source.rose() is registry.demand_rose


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("connection refused"),
        RPCError("deadline exceeded", RPCStatusCode.DEADLINE_EXCEEDED, b""),
        RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b""),
    ],
)
async def test_without_temporal_the_local_demand_stands_alone(error: Exception) -> None:
    temporal = FakeTemporal(error=error)
    source, registry, clock = gateway_source(temporal)
    model = registry.models["ns/chat"]
    assert await source.demand(namespace="ns", name="chat") == 0
    model.held = 2
    assert await source.demand(namespace="ns", name="chat") == 2
    assert len(temporal.queries) == 1, "a failure is cached like an answer"
    temporal.error, temporal.demand = None, 4
    await clock.advance(QUERY_CACHE_S)
    assert await source.demand(namespace="ns", name="chat") == 4
