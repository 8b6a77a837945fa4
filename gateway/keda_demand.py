"""The demand the gateway tells KEDA (`gateway.keda_scaler`) for a model: the larger of
this gateway's demand now and the demand of every gateway together, as the model's
DeploymentWorkflow sums their reports (its `status` query's `demand`).

This gateway's own count is exact and current (a request held at zero counts the
moment it arrives); the workflow's sum covers the other gateways but lags by up to a
report period. The query is answered from a cache for QUERY_CACHE_S per model, so
KEDA's polling (IsActive, GetMetrics and each open stream, per ScaledObject) costs at
most one Temporal query per model per QUERY_CACHE_S. With Temporal away (or the
workflow not there yet) the local count stands alone, with one warning until a query
succeeds again.

Reading the counts has no side effect: `gateway.demand.current_demand` resets the
count of requests that came and went, which belongs to the demand reporter."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gateway.clock import MONOTONIC, Clock
from gateway.demand import local_demand
from gateway.registry import Model, ModelRegistry
from gateway.workflow_client import deployment_status

log = logging.getLogger("kama.gateway")

QUERY_CACHE_S: Final = 1.0
# KEDA waits for an answer only so long; a stalled Temporal costs at most this, and its
# failure is cached like an answer
QUERY_RPC_TIMEOUT: Final = timedelta(seconds=1)


@dataclass(frozen=True)
class _Answer:
    uid: str  # a model deleted and created again under its name has another workflow
    demand: int  # 0 when the query failed
    at: float


class GatewayDemandSource:
    """A `gateway.keda_scaler.DemandSource` over the gateway's registry and its
    Temporal client."""

    def __init__(
        self,
        *,
        registry: ModelRegistry,
        client: Client,
        cluster: str,
        clock: Clock = MONOTONIC,
    ) -> None:
        self._registry = registry
        self._client = client
        self._cluster = cluster
        self._clock = clock
        self._answers: dict[str, _Answer] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._failing: set[str] = set()  # models whose last query failed (warned once)

    def rose(self) -> asyncio.Event:
        return self._registry.demand_rose

    async def demand(self, *, namespace: str, name: str) -> int | None:
        model = self._registry.models.get(f"{namespace}/{name}")
        if model is None:
            return None
        return max(local_demand(model), await self.aggregated(model))

    async def aggregated(self, model: Model) -> int:
        """Every gateway's demand for `model` as its workflow last summed it (0 when
        unknown), at most QUERY_CACHE_S old."""
        key = model.key
        for gone in set(self._answers) - set(self._registry.models):
            self._answers.pop(gone, None)
            self._locks.pop(gone, None)
        async with self._locks.setdefault(key, asyncio.Lock()):  # one query at a time
            cached = self._answers.get(key)
            now = self._clock.now()
            if cached is not None and cached.uid == model.uid and now - cached.at < QUERY_CACHE_S:
                return cached.demand
            demand = await self._query(model)
            self._answers[key] = _Answer(uid=model.uid, demand=demand, at=self._clock.now())
            return demand

    async def _query(self, model: Model) -> int:
        try:
            status = await deployment_status(
                self._client,
                deployment=model.ref(cluster=self._cluster),
                rpc_timeout=QUERY_RPC_TIMEOUT,
            )
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:  # not started yet, or ended
                log.debug("no deployment workflow for %s: its local demand stands", model.key)
                self._failing.discard(model.key)
                return 0
            self._warn(model, exc)
            return 0
        except Exception as exc:  # Temporal away, the query failed or timed out
            self._warn(model, exc)
            return 0
        if model.key in self._failing:
            self._failing.discard(model.key)
            log.info("querying the demand of %s works again", model.key)
        return status.demand

    def _warn(self, model: Model, exc: Exception) -> None:
        if model.key not in self._failing:
            self._failing.add(model.key)
            log.warning(
                "querying the demand of %s over every gateway failed (%s); KEDA gets this "
                "gateway's demand alone until it works again",
                model.key,
                exc,
            )
