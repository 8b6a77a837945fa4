"""The gateway's decisions without a network: which models and endpoints the watches
yield, name resolution, routing by slot pressure, llama-server metrics parsing and
the OpenAI error shape."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gateway.backend_load import parse_llama_metrics
from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.registry import Endpoint, ModelRegistry
from gateway.routing import choose_endpoint
from gateway.wake import Waker
from tests.unit.gateway_support import deployment as deployment  # also for other gateway tests
from tests.unit.gateway_support import pod as pod


def test_registry_tracks_routable_endpoints_and_readiness() -> None:
    registry = ModelRegistry()
    registry.apply_pod("ADDED", pod("p0"))  # before its deployment is known
    registry.apply_deployment("ADDED", deployment("chat", aliases=["tiny"]))
    model = registry.resolve("ns/chat")
    assert model is not None and registry.resolve("tiny") is model
    assert model.max_queued == 7 and model.cold_start_s == 90
    assert (
        set(model.endpoints) == {"p0"} and model.endpoints["p0"].slots == 4 and model.ready.is_set()
    )
    registry.apply_pod("MODIFIED", pod("p0", draining=True))
    assert model.endpoints == {} and not model.ready.is_set()
    registry.apply_pod("MODIFIED", pod("p1", ready=False))
    assert model.endpoints == {}
    registry.apply_pod("MODIFIED", pod("p1"))
    registry.apply_pod("DELETED", pod("p1"))
    assert model.endpoints == {}
    registry.apply_deployment("DELETED", deployment("chat"))
    assert registry.resolve("ns/chat") is None


def test_supervisor_ready_pod_is_routed_before_the_kubelet_says_so() -> None:
    registry = ModelRegistry()
    registry.apply_deployment("ADDED", deployment("chat"))
    model = registry.resolve("ns/chat")
    assert model is not None
    registry.apply_pod("ADDED", pod("p0", ready=False))
    assert set(model.starting) == {"p0"} and not model.endpoints
    registry.confirm_early(model, "p0")
    assert model.endpoints["p0"].early and model.ready.is_set()
    registry.apply_pod("MODIFIED", pod("p0", ready=False))  # the kubelet has not probed yet
    assert "p0" in model.endpoints
    registry.apply_pod("MODIFIED", pod("p0"))
    assert not model.endpoints["p0"].early
    registry.apply_pod("MODIFIED", pod("p0", draining=True))
    assert not model.endpoints and not model.starting


def test_aliases_must_be_unique_to_resolve() -> None:
    registry = ModelRegistry()
    registry.apply_deployment("ADDED", deployment("a", uid="1", aliases=["shared", "a1"]))
    registry.apply_deployment("ADDED", deployment("b", uid="2", aliases=["shared"]))
    assert registry.resolve("shared") is None and registry.resolve("a1") is not None
    assert registry.resolve("ns/missing") is None


def test_reason_comes_from_the_blocking_condition() -> None:
    registry = ModelRegistry()
    conditions = [
        {"type": "FitFailed", "status": "True", "reason": "FitFailed", "message": "needs 9 GiB"}
    ]
    registry.apply_deployment("ADDED", deployment("big", conditions=conditions))
    model = registry.resolve("ns/big")
    assert model is not None and model.reason == "FitFailed: needs 9 GiB"


def test_routing_prefers_least_slot_pressure_then_latency() -> None:
    a = Endpoint(pod="a", ip="1", slots=4, in_flight=2)
    b = Endpoint(pod="b", ip="2", slots=8, in_flight=3)  # 3/8 < 2/4
    assert choose_endpoint([a, b], exclude=frozenset(), now=0.0) is b
    b.observe_backend(held=5, ours=3)  # another gateway has 2 there: 5/8 > 2/4
    assert choose_endpoint([a, b], exclude=frozenset(), now=0.0) is a
    b.observe_backend(held=3, ours=3)  # only ours: a stale poll must not count them twice
    assert choose_endpoint([a, b], exclude=frozenset(), now=0.0) is b
    c = Endpoint(pod="c", ip="3", slots=4, in_flight=2, latency_s=0.5)
    a.latency_s = 0.1
    assert choose_endpoint([c, a], exclude=frozenset(), now=0.0) is a
    assert choose_endpoint([a], exclude=frozenset({"a"}), now=0.0) is None
    a.unreachable_until = 5.0  # its connection timed out: the others first until then
    assert choose_endpoint([c, a], exclude=frozenset(), now=1.0) is c
    assert choose_endpoint([c, a], exclude=frozenset(), now=6.0) is a


def test_llama_metrics_parsing() -> None:
    text = "# HELP x\nllamacpp:requests_processing 3\nllamacpp:requests_deferred 2\nother 1\n"
    assert parse_llama_metrics(text) == (3, 2)
    assert parse_llama_metrics("garbage") == (0, 0)


def test_errors_use_the_openai_shape() -> None:
    response = GatewayError(
        429, "queue full", type="rate_limit_error", code="queue_full", retry_after_s=5
    ).response()
    assert response.status_code == 429 and response.headers["retry-after"] == "5"
    assert json.loads(bytes(response.body)) == {
        "error": {
            "message": "queue full",
            "type": "rate_limit_error",
            "param": None,
            "code": "queue_full",
        }
    }


class RecordingTemporal:
    """Stands in for the Temporal client in the wake queue's unit tests: it records
    the wake workflows the gateway starts and the signals it sends them (the real
    calls are covered on the stack)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.signalled: list[tuple[str, str | None, str]] = []

    async def start_workflow(self, *_args: Any, id: str, **_kwargs: Any) -> RecordingHandle:
        self.started.append(id)
        return RecordingHandle(temporal=self, workflow_id=id, run_id=f"run-{len(self.started)}")

    def get_workflow_handle(self, workflow_id: str, *, run_id: str | None) -> RecordingHandle:
        return RecordingHandle(temporal=self, workflow_id=workflow_id, run_id=run_id)


@dataclass
class RecordingHandle:
    temporal: RecordingTemporal
    workflow_id: str
    run_id: str | None

    async def signal(self, signal: Any, *_args: Any, **_kwargs: Any) -> None:
        name = getattr(signal, "__temporal_signal_definition").name
        self.temporal.signalled.append((self.workflow_id, self.run_id, name))


def waker_and_model(**scaling: Any) -> tuple[Waker, RecordingTemporal, ModelRegistry]:
    temporal = RecordingTemporal()
    registry = ModelRegistry()
    waker = Waker(
        client=temporal,  # type: ignore[arg-type]
        task_queue="q",
        metrics=GatewayMetrics(),
        registry=registry,
        http=httpx.AsyncClient(),
    )
    obj = deployment("chat")
    obj["spec"]["scaling"].update(scaling)
    registry.apply_deployment("ADDED", obj)
    return waker, temporal, registry


async def test_held_requests_start_one_wake_and_go_to_the_first_replica() -> None:
    waker, temporal, registry = waker_and_model()
    model = registry.resolve("ns/chat")
    assert model is not None
    held = [asyncio.create_task(waker.hold_until_ready(model)) for _ in range(5)]
    await asyncio.sleep(0.05)
    assert model.held == 5 and not any(t.done() for t in held)
    registry.apply_pod("ADDED", pod("p0"))
    await asyncio.wait_for(asyncio.gather(*held), timeout=5)
    assert temporal.started == ["wake/ns/chat"] and model.held == 0
    await asyncio.sleep(0.05)
    # once, not 5 times, and to the run this gateway started or joined
    assert temporal.signalled == [("wake/ns/chat", "run-1", "replica ready")]


async def test_queue_overflow_deletion_and_timeout_are_clear_errors() -> None:
    waker, _, registry = waker_and_model(maxQueuedRequests=1, coldStartTimeout="200ms")
    model = registry.resolve("ns/chat")
    assert model is not None
    first = asyncio.create_task(waker.hold_until_ready(model))
    await asyncio.sleep(0.01)
    with pytest.raises(GatewayError) as full:
        await waker.hold_until_ready(model)
    assert full.value.status == 429 and full.value.retry_after_s
    with pytest.raises(GatewayError) as timeout:
        await first
    assert timeout.value.status == 503 and "within 0.2s" in timeout.value.message
    held = asyncio.create_task(waker.hold_until_ready(model))
    await asyncio.sleep(0.01)
    registry.apply_deployment("DELETED", deployment("chat"))
    with pytest.raises(GatewayError) as deleted:
        await held
    assert deleted.value.status == 503 and "deleted" in deleted.value.message


def test_request_metrics_are_exported_with_their_labels() -> None:
    from prometheus_client import generate_latest

    metrics = GatewayMetrics()
    for name, seconds in (("p1", 0.02), ("p2", 0.3)):
        series = metrics.series(model="ns/m", route="chat", pod=name)
        series.begin()
        series.ttft.observe(seconds)
        series.duration.observe(seconds * 2)
        series.end()
        metrics.count_request(model="ns/m", route="chat", code="200")
    held = metrics.series(model="ns/m", route="chat", pod="p1")
    held.begin()
    metrics.count_request(model="ns/m", route="chat", code="499")
    text = generate_latest(metrics.registry).decode()
    assert 'kama_gateway_requests_total{code="200",model="ns/m",route="chat"} 2.0' in text
    assert 'kama_gateway_requests_total{code="499",model="ns/m",route="chat"} 1.0' in text
    assert 'kama_gateway_in_flight{model="ns/m"} 1.0' in text
    assert 'kama_gateway_pod_in_flight{model="ns/m",pod="p1"} 1.0' in text
    assert 'kama_gateway_pod_requests_total{model="ns/m",pod="p1"} 2.0' in text
    ttft = "kama_gateway_time_to_first_byte_seconds"
    assert f'{ttft}_bucket{{le="0.025",model="ns/m",route="chat"}} 1.0' in text
    assert f'{ttft}_bucket{{le="+Inf",model="ns/m",route="chat"}} 2.0' in text
    assert f'{ttft}_count{{model="ns/m",route="chat"}} 2.0' in text
    metrics.forget_pod("ns/m", "p2")
    after = generate_latest(metrics.registry).decode()
    assert 'pod="p2"' not in after and f'{ttft}_count{{model="ns/m",route="chat"}} 2.0' in after


def test_a_lease_counts_its_request_until_released_once() -> None:
    registry = ModelRegistry()
    registry.apply_deployment("ADDED", deployment("chat"))
    registry.apply_pod("ADDED", pod("p0", ip="10.0.0.1", slots=2))
    registry.apply_pod("ADDED", pod("p1", ip="10.0.0.2", slots=2))
    model = registry.resolve("ns/chat")
    assert model is not None
    first = registry.acquire(model, route="chat", exclude=(), now=0.0)
    second = registry.acquire(model, route="chat", exclude=(), now=0.0)
    assert first is not None and second is not None
    assert first.endpoint is not second.endpoint  # the busier one is passed over
    assert model.in_flight == 2 and model.requests_since_report == 2
    assert registry.acquire(model, route="chat", exclude={"p0", "p1"}, now=0.0) is None
    first.release()
    first.release()  # a second release changes nothing
    assert model.in_flight == 1 and first.endpoint.in_flight == 0
    assert second.series.model_in_flight.value == 1 and second.series.pod.in_flight == 1
    second.release()
    assert model.in_flight == 0 and second.endpoint.in_flight == 0
    assert second.series.model_in_flight.value == 0
    assert first.endpoint.served == second.endpoint.served == 1  # served counts stay
