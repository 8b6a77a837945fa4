"""The gateway's decisions without a network: which models and endpoints the watches
yield, name resolution, routing by slot pressure, llama-server metrics parsing and
the OpenAI error shape."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from gateway.aliases import AliasClaim, alias_owners
from gateway.backend_load import parse_llama_metrics
from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.registry import Endpoint, Model, ModelRegistry
from gateway.routing import choose_endpoint
from gateway.wake import Waker
from kama.reasons import DeploymentReason, Failure
from tests.unit.gateway_support import ManualClock, RecordingTemporal, deployment, pod


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


def test_the_oldest_claim_on_an_alias_owns_it_whatever_the_event_order() -> None:
    """Two namespaces use one alias: the older ModelDeployment keeps it (a newcomer
    cannot take over a name clients already use), whichever the watch brings first;
    the newer one's alias does not route; at the same second, namespace/name decides."""
    older = deployment("a", uid="1", aliases=["shared", "a1"], created="2026-01-01T00:00:00Z")
    newer = deployment("b", namespace="other", uid="2", aliases=["shared"],
                       created="2026-01-02T00:00:00Z")  # fmt: skip
    for events in ((older, newer), (newer, older)):
        registry = ModelRegistry()
        for obj in events:
            registry.apply_deployment("ADDED", obj)
        owner = registry.resolve("shared")
        assert owner is not None and owner.key == "ns/a", [o["metadata"]["name"] for o in events]
        assert registry.alias_owners == {"shared": "ns/a", "a1": "ns/a"}
        registry.apply_deployment("DELETED", older)  # the claim passes to the next oldest
        moved = registry.resolve("shared")
        assert moved is not None and moved.key == "other/b"
    registry.apply_deployment("ADDED", deployment("c", uid="3", aliases=["shared"],
                                                  created="2026-01-02T00:00:00Z"))  # fmt: skip
    tied = registry.resolve("shared")
    assert tied is not None and tied.key == "ns/c"  # same second: "ns/c" < "other/b"
    assert registry.resolve("a1") is None and registry.resolve("ns/missing") is None


def test_alias_owners_is_a_pure_rule() -> None:
    claims = [
        AliasClaim(key="x/new", aliases=("chat", "new"), created=20),
        AliasClaim(key="y/old", aliases=("chat",), created=10),
        AliasClaim(key="a/same", aliases=("tie",), created=5),
        AliasClaim(key="b/same", aliases=("tie",), created=5),
    ]
    assert alias_owners(claims) == {"chat": "y/old", "new": "x/new", "tie": "a/same"}


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


def waker_and_model(
    **scaling: Any,
) -> tuple[Waker, RecordingTemporal, ModelRegistry, ManualClock]:
    temporal = RecordingTemporal()
    registry = ModelRegistry()
    clock = ManualClock()
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
    obj["spec"]["scaling"].update(scaling)
    registry.apply_deployment("ADDED", obj)
    return waker, temporal, registry, clock


async def test_held_requests_start_one_wake_and_go_to_the_first_replica() -> None:
    waker, temporal, registry, clock = waker_and_model()
    model = registry.resolve("ns/chat")
    assert model is not None
    held = [asyncio.create_task(waker.hold_until_ready(model)) for _ in range(5)]
    await clock.advance(1)
    assert model.held == 5 and not any(t.done() for t in held)
    registry.apply_pod("ADDED", pod("p0"))
    await clock.settle()
    assert all(t.done() and t.exception() is None for t in held)
    assert temporal.started == ["wake/ns/chat"] and model.held == 0
    # once, not 5 times, and to the run this gateway started or joined
    assert temporal.signalled == [("wake/ns/chat", "run-1", "replica ready")]


async def test_queue_overflow_deletion_and_timeout_are_clear_errors() -> None:
    waker, _, registry, clock = waker_and_model(maxQueuedRequests=1, coldStartTimeout="200ms")
    model = registry.resolve("ns/chat")
    assert model is not None
    arrived = clock.now()
    first = asyncio.create_task(waker.hold_until_ready(model))
    await clock.settle()
    with pytest.raises(GatewayError) as full:
        await waker.hold_until_ready(model)
    assert full.value.status == 429 and full.value.retry_after_s
    await clock.advance_until(first.done, within=1)
    assert clock.now() == pytest.approx(arrived + 0.2), "answered at the cold-start timeout"
    with pytest.raises(GatewayError) as timeout:
        await first
    assert timeout.value.status == 503 and "within 0.2s" in timeout.value.message
    held = asyncio.create_task(waker.hold_until_ready(model))
    await clock.settle()
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


def two_single_slot_replicas() -> tuple[ModelRegistry, Model]:
    registry = ModelRegistry()
    registry.apply_deployment("ADDED", deployment("chat"))
    registry.apply_pod("ADDED", pod("p0", ip="10.0.0.1", slots=1))
    registry.apply_pod("ADDED", pod("p1", ip="10.0.0.2", slots=1))
    model = registry.resolve("ns/chat")
    assert model is not None
    return registry, model


async def test_requests_beyond_the_slots_wait_for_whichever_replica_frees_first() -> None:
    registry, model = two_single_slot_replicas()
    first = registry.acquire(model, route="chat", exclude=(), now=0.0)
    second = registry.acquire(model, route="chat", exclude=(), now=0.0)
    assert first is not None and second is not None
    assert registry.acquire(model, route="chat", exclude=(), now=0.0) is None  # both full
    waiting = [
        asyncio.create_task(registry.wait_for_slot(model, route="chat", exclude=()))
        for _ in range(3)
    ]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiting) and len(model.slot_waiters) == 3
    second.release()  # p1 frees first: the longest waiting request gets it
    await asyncio.sleep(0)
    assert waiting[0].done() and not waiting[1].done()
    taken = waiting[0].result()
    assert taken is not None and taken.endpoint is second.endpoint
    waiting[1].cancel()  # its client left: the next freed slot skips it
    first.release()
    await asyncio.sleep(0)
    last = waiting[2].result()
    assert last is not None and last.endpoint is first.endpoint
    assert model.in_flight == 2 and not model.slot_waiters
    taken.release()
    last.release()
    assert model.in_flight == 0 and all(e.in_flight == 0 for e in model.endpoints.values())


async def test_waiting_for_a_slot_ends_when_no_replica_is_left_to_try() -> None:
    registry, model = two_single_slot_replicas()
    first = registry.acquire(model, route="chat", exclude=(), now=0.0)
    assert first is not None
    tried = {"p1"}  # its connection failed: only p0 may take this request
    waiting = asyncio.create_task(registry.wait_for_slot(model, route="chat", exclude=tried))
    await asyncio.sleep(0)
    assert not waiting.done()
    registry.apply_pod("DELETED", pod("p0", ip="10.0.0.1", slots=1))
    assert await asyncio.wait_for(waiting, 1) is None  # back to the proxy: hold or 502
    first.release()
    assert model.in_flight == 0


def condition(kind: str, status: str, reason: str, message: str = "why", **extra: Any) -> Any:
    return {"type": kind, "status": status, "reason": reason, "message": message, **extra}


UNSTARTABLE = [
    condition("FitFailed", "True", DeploymentReason.FIT_FAILED, "needs 9 GiB"),
    condition("ArtifactReady", "False", Failure.CHECKSUM_MISMATCH, "digest differs"),
    condition("ArtifactReady", "False", DeploymentReason.ARTIFACT_FAILED, "phase Failed"),
    condition("ArtifactReady", "False", DeploymentReason.ARTIFACT_MISSING, "no such artifact"),
    condition("ArtifactReady", "False", DeploymentReason.ARTIFACT_NOT_USABLE, "no weights"),
    condition("RuntimeReady", "False", DeploymentReason.RUNTIME_FAILED, "3 pods stopped"),
    condition("RuntimeReady", "False", DeploymentReason.FORBIDDEN, "pods is forbidden"),
    condition("RuntimeReady", "False", DeploymentReason.PROGRESS_DEADLINE_EXCEEDED, "gave up"),
    condition("RuntimeReady", "False", DeploymentReason.CRASH_LOOP, "restarted 5 times"),
]
STARTABLE = [
    condition("FitFailed", "False", DeploymentReason.FITS, "CPU"),
    # still importing: the message may say anything, the reason says "wait"
    condition(
        "ArtifactReady",
        "False",
        DeploymentReason.ARTIFACT_NOT_READY,
        "ModelArtifact m does not exist (phase Failed)",
    ),
    condition("RuntimeReady", "False", DeploymentReason.SCALED_TO_ZERO, "no replica is wanted"),
    condition("RuntimeReady", "False", DeploymentReason.STARTING, "0/1 ready"),
    # about an older spec (a newer generation is being worked on): not a verdict
    condition("FitFailed", "True", DeploymentReason.FIT_FAILED, "old spec", observedGeneration=1),
    condition(
        "ArtifactReady",
        "False",
        DeploymentReason.ARTIFACT_MISSING,
        "old spec",
        observedGeneration=1,
    ),
]


def at_zero(
    *conditions: Any, generation: int = 2
) -> tuple[Waker, RecordingTemporal, Model, ManualClock]:
    waker, temporal, registry, clock = waker_and_model(coldStartTimeout="10m")
    obj = deployment("chat", conditions=list(conditions))
    obj["metadata"]["generation"] = generation
    registry.apply_deployment("MODIFIED", obj)
    model = registry.resolve("ns/chat")
    assert model is not None
    return waker, temporal, model, clock


@pytest.mark.parametrize("blocking", UNSTARTABLE, ids=lambda c: f"{c['type']}-{c['reason']}")
async def test_a_model_that_cannot_start_is_refused_at_once(blocking: Any) -> None:
    waker, temporal, model, _ = at_zero(blocking)
    with pytest.raises(GatewayError) as refused:
        await waker.hold_until_ready(model)
    assert refused.value.status == 503 and refused.value.retry_after_s
    assert refused.value.code == "cannot_start"
    assert f"{blocking['reason']}: {blocking['message']}" in refused.value.message
    assert temporal.started == [] and model.held == 0  # nothing to wake


@pytest.mark.parametrize("progress", STARTABLE, ids=lambda c: f"{c['type']}-{c['reason']}")
async def test_a_model_on_its_way_is_waited_for(progress: Any) -> None:
    waker, temporal, model, clock = at_zero(progress)
    held = asyncio.create_task(waker.hold_until_ready(model))
    await clock.advance(5)
    assert not held.done() and temporal.started == ["wake/ns/chat"]
    held.cancel()
    await asyncio.gather(held, return_exceptions=True)


async def test_held_requests_are_answered_once_the_status_says_it_cannot_start() -> None:
    waker, _, model, clock = at_zero(condition("RuntimeReady", "False", "ScaledToZero"))
    held = [asyncio.create_task(waker.hold_until_ready(model)) for _ in range(3)]
    await clock.advance(1)
    assert model.held == 3
    obj = deployment(
        "chat", conditions=[condition("ArtifactReady", "False", "InvalidGGUF", "bad magic")]
    )
    obj["metadata"]["generation"] = 2
    waker.registry.apply_deployment("MODIFIED", obj)
    await clock.settle()
    assert all(t.done() for t in held), "answered at once, not at the cold-start timeout"
    results = await asyncio.gather(*held, return_exceptions=True)
    for result in results:
        assert isinstance(result, GatewayError) and result.status == 503
        assert "InvalidGGUF: bad magic" in result.message
    assert model.held == 0
    waker.registry.apply_deployment("MODIFIED", deployment("chat"))  # fixed: held again
    again = asyncio.create_task(waker.hold_until_ready(model))
    await clock.advance(5)
    assert not again.done()
    again.cancel()
    await asyncio.gather(again, return_exceptions=True)
