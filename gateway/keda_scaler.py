"""KEDA's external scaler, served by the gateway: how KEDA learns a ModelDeployment's
demand, so an HPA scales its replicas on it and KEDA activates a model at zero.

The gateway is where demand is seen first (requests in flight, queued for a free slot,
held for a replica at zero), so it answers KEDA's external-scaler contract
(`gateway/keda/externalscaler.proto`, KEDA v2.21) over plaintext gRPC; KEDA dials it
in-cluster. The ScaledObject Kama writes for a ModelDeployment has the model's name and
namespace, and `scalerMetadata`:

- `targetPerReplica` (required): the demand one replica should carry, slots *
  target% / 100, as a decimal string; the metric spec's target;
- `namespace`, `deployment` (optional): the ModelDeployment, when not the
  ScaledObject's own namespace and name.

Answers: `IsActive` is demand > 0; `GetMetricSpec` one `kama-demand` metric whose
target is `targetPerReplica`; `GetMetrics` the demand now; `StreamIsActive` the
activity at once, then each change. A request held for a model at zero reaches KEDA
through the stream as soon as it arrives (the demand source's rise hook wakes it), not
at KEDA's next poll; otherwise the stream re-checks every STREAM_RECHECK_S. A model
this gateway does not know is NOT_FOUND; bad metadata is INVALID_ARGUMENT.
StreamMetricSpec is not served (KEDA falls back to GetMetricSpec on Unimplemented).

The demand comes from a `DemandSource` (`gateway.keda_demand.GatewayDemandSource` in
the gateway), so the servicer is tested with a fake one."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Final, Protocol, TypeAlias

import grpc

from gateway.clock import MONOTONIC, Clock, wait_for_event
from gateway.keda import externalscaler_pb2 as pb
from gateway.keda import externalscaler_pb2_grpc
from kama.scaled_object import TARGET_PER_REPLICA_KEY

log = logging.getLogger("kama.gateway")

METRIC_NAME: Final = "kama-demand"
TARGET_KEY: Final = TARGET_PER_REPLICA_KEY  # written by Kama into its ScaledObjects
NAMESPACE_KEY: Final = "namespace"
DEPLOYMENT_KEY: Final = "deployment"
STREAM_RECHECK_S: Final = 5.0  # a stream's check without a rise (falls, other gateways)
# a rise the last check already saw is still flagged (the demand reporter clears the
# flag within its coalescing delay): look again after this, rather than at once
RISE_SETTLE_S: Final = 0.25
STOP_GRACE_S: Final = 1.0  # unary calls finish; open streams end (KEDA reconnects)

if TYPE_CHECKING:
    Context: TypeAlias = grpc.aio.ServicerContext[object, object]


class DemandSource(Protocol):
    """What the scaler needs to know about demand (the consumer's small interface)."""

    async def demand(self, *, namespace: str, name: str) -> int | None:
        """Requests in flight or queued for the model now; None if the model is unknown."""
        ...

    def rose(self) -> asyncio.Event:
        """Set when demand may have risen (a request arrived); the source clears it."""
        ...


class KedaExternalScaler(externalscaler_pb2_grpc.ExternalScalerServicer):
    """The `externalscaler.ExternalScaler` service over a `DemandSource` (grpc.aio)."""

    def __init__(self, *, source: DemandSource, clock: Clock = MONOTONIC) -> None:
        self._source = source
        self._clock = clock

    async def IsActive(self, request: pb.ScaledObjectRef, context: Context) -> pb.IsActiveResponse:
        return pb.IsActiveResponse(result=await self._demand(request, context) > 0)

    async def StreamIsActive(
        self, request: pb.ScaledObjectRef, context: Context
    ) -> AsyncIterator[pb.IsActiveResponse]:
        sent: bool | None = None
        try:
            while True:
                active = await self._demand(request, context) > 0
                if active != sent:
                    yield pb.IsActiveResponse(result=active)
                    sent = active
                await self._until_next_check(active=active)
        except asyncio.CancelledError:  # the client went away, or the server stops
            log.debug("KEDA stream for %s/%s ended", request.namespace, request.name)
            raise

    async def GetMetricSpec(
        self, request: pb.ScaledObjectRef, context: Context
    ) -> pb.GetMetricSpecResponse:
        target = await _target(request, context)
        spec = pb.MetricSpec(
            metricName=METRIC_NAME, targetSize=math.ceil(target), targetSizeFloat=target
        )
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: Context
    ) -> pb.GetMetricsResponse:
        demand = await self._demand(request.scaledObjectRef, context)
        value = pb.MetricValue(metricName=METRIC_NAME, metricValue=demand, metricValueFloat=demand)
        return pb.GetMetricsResponse(metricValues=[value])

    async def _demand(self, ref: pb.ScaledObjectRef, context: Context) -> int:
        namespace, name = await _model(ref, context)
        demand = await self._source.demand(namespace=namespace, name=name)
        if demand is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"this gateway knows no ModelDeployment {namespace}/{name} (check the "
                f"ScaledObject's name and namespace, or its scalerMetadata "
                f"{NAMESPACE_KEY}/{DEPLOYMENT_KEY})",
            )
        return demand

    async def _until_next_check(self, *, active: bool) -> None:
        """Wait until activity is worth checking again: at once when demand may have
        risen from zero, else after STREAM_RECHECK_S (a fall, or demand at another
        gateway, may wait that long)."""
        rose = self._source.rose()
        if active:  # only a fall can change it
            await self._clock.sleep(STREAM_RECHECK_S)
        elif rose.is_set():  # a rise the check just made saw, not yet cleared
            await self._clock.sleep(RISE_SETTLE_S)
        else:
            await wait_for_event(rose, within=STREAM_RECHECK_S, clock=self._clock)


async def _model(ref: pb.ScaledObjectRef, context: Context) -> tuple[str, str]:
    """The ModelDeployment a ScaledObject scales: its metadata's override, or its own
    namespace and name."""
    meta = ref.scalerMetadata
    namespace = meta.get(NAMESPACE_KEY) or ref.namespace
    name = meta.get(DEPLOYMENT_KEY) or ref.name
    if not namespace or not name:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the ScaledObjectRef names no ModelDeployment (namespace {namespace!r}, "
            f"name {name!r}); set its name and namespace or scalerMetadata "
            f"{NAMESPACE_KEY}/{DEPLOYMENT_KEY}",
        )
    return namespace, name


async def _target(ref: pb.ScaledObjectRef, context: Context) -> float:
    raw = ref.scalerMetadata.get(TARGET_KEY)
    try:
        target = float(raw) if raw is not None else math.nan
    except ValueError:
        target = math.nan
    if not math.isfinite(target) or target <= 0:
        found = "it is missing" if raw is None else f"got {raw!r}"
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"scalerMetadata.{TARGET_KEY} must be a positive number (the demand one "
            f"replica should carry); {found}",
        )
    return target


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


async def serve_keda_scaler(*, scaler: KedaExternalScaler, host: str, port: int) -> grpc.aio.Server:
    """Start serving `scaler` on `host:port`, plaintext HTTP/2 (KEDA dials it
    in-cluster); stop it with `stop_keda_scaler`."""
    server = grpc.aio.server()
    externalscaler_pb2_grpc.add_ExternalScalerServicer_to_server(scaler, server)
    address = _address(host, port)
    try:
        server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"the KEDA scaler cannot listen on {address}: {exc}") from exc
    await server.start()
    log.info("serving KEDA's external scaler on %s", address)
    return server


async def stop_keda_scaler(server: grpc.aio.Server, *, grace_s: float = STOP_GRACE_S) -> None:
    """Stop accepting calls; calls in progress get `grace_s`, then open streams end."""
    await server.stop(grace_s)
