"""Requests for a model with no ready replica: start (or join) its WakeWorkflow and
hold the request in a bounded per-model queue until the first endpoint appears.
Overflow is 429, the cold-start timeout 503; both carry Retry-After, and the 503
says why the deployment is not serving. A model whose status says it cannot start
(`gateway.deployment_status`) is not woken: its requests get their 503 with the
reason at once, and requests already held get it as soon as the status says so.

Temporal may be away (restarting, partitioned, stalled) when the first request
arrives: every call carries an RPC timeout, and starting/joining the wake is retried
with capped back-off for as long as requests are held, so held requests are answered
soon after Temporal returns rather than at the end of the cold-start timeout."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.pod_reads import read_pod
from gateway.clock import MONOTONIC, Clock, wait_for_event
from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.registry import Model, ModelRegistry
from gateway.workflow_client import start_wake, tell_replica_ready
from kama.serving_plan import SUPERVISOR_PORT

log = logging.getLogger("kama.gateway")

RETRY_AFTER_QUEUE_FULL_S = 5
EARLY_PROBE_S = 0.05  # while requests are held for a starting replica
EARLY_PROBE_TIMEOUT_S = 0.25  # the whole answer (a total deadline, not per read)
EARLY_PROBE_MAX_BYTES = 64 * 1024
RETRY_AFTER_COLD_START_S = 30
# Temporal calls: a stalled server must not hold a call (and the wake) forever
TEMPORAL_RPC_TIMEOUT = timedelta(seconds=5)
WAKE_RETRY_START_S = 0.25
WAKE_RETRY_MAX_S = 5.0
READY_SIGNAL_ATTEMPTS = 5


class Waker:
    def __init__(
        self,
        *,
        client: Client,
        task_queue: str,
        cluster: str,
        metrics: GatewayMetrics,
        registry: ModelRegistry,
        http: httpx.AsyncClient,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.client = client
        self.task_queue = task_queue
        self.cluster = cluster  # wakes and deployments are this cluster's workflows
        self.metrics = metrics
        self.registry = registry
        self.http = http
        self.clock = clock
        self._starting: dict[str, asyncio.Task[str | None]] = {}
        self._probing: dict[str, asyncio.Task[None]] = {}

    async def _probe_starting(self, model: Model) -> None:
        """While requests are held, ask starting pods' supervisors directly (the same
        /readyz the kubelet probes, every 50 ms instead of every probe period)."""
        while model.held and not model.endpoints:
            for endpoint in list(model.starting.values()):
                try:
                    answer = await read_pod(
                        self.http,
                        f"http://{endpoint.ip}:{SUPERVISOR_PORT}/readyz",
                        deadline_s=EARLY_PROBE_TIMEOUT_S,
                        max_bytes=EARLY_PROBE_MAX_BYTES,
                    )
                except httpx.HTTPError:
                    continue
                if answer.status == 200:
                    self.registry.confirm_early(model, endpoint.pod)
            await self.clock.sleep(EARLY_PROBE_S)

    async def _start_wake(self, model: Model) -> str | None:
        """Start or join the wake, trying again with back-off while requests are held
        and no replica is ready; the run to tell when a replica is ready (None if the
        wait ended before any attempt succeeded)."""
        backoff = WAKE_RETRY_START_S
        failures = 0
        while model.held and not model.endpoints and not model.cannot_start:
            try:
                run_id = await self._start_wake_once(model)
            except (RPCError, RuntimeError, TimeoutError) as exc:
                failures += 1
                log.warning(
                    "starting the wake of %s failed (attempt %d, retrying in %.1fs): %s",
                    model.key,
                    failures,
                    backoff,
                    exc,
                )
                await self.clock.sleep(backoff)
                backoff = min(backoff * 2, WAKE_RETRY_MAX_S)
                continue
            if failures:
                log.info("started the wake of %s after %d failed attempts", model.key, failures)
            return run_id
        return None

    async def _start_wake_once(self, model: Model) -> str | None:
        run_id = await start_wake(
            self.client,
            deployment=model.ref(cluster=self.cluster),
            timeout_s=model.cold_start_s,
            task_queue=self.task_queue,
            rpc_timeout=TEMPORAL_RPC_TIMEOUT,
        )
        self.metrics.cold_starts.labels(model.key).inc()
        return run_id

    def _ensure_wake(self, model: Model) -> None:
        task = self._starting.get(model.key)
        if task is None or task.done():
            task = asyncio.create_task(self._start_wake(model))
            self._starting[model.key] = task
            task.add_done_callback(_log_failure)

    async def hold_until_ready(self, model: Model) -> None:
        """Return once the model has an endpoint; raise GatewayError 429/503 otherwise."""
        if model.endpoints:
            return
        if model.cannot_start:
            raise _cannot_start(model)
        if model.held >= model.max_queued:
            raise GatewayError(
                429,
                f"model {model.key} is starting and its queue is full "
                f"({model.max_queued} requests); retry later",
                type="rate_limit_error",
                code="queue_full",
                retry_after_s=RETRY_AFTER_QUEUE_FULL_S,
            )
        model.held += 1
        self.registry.demand_rose.set()
        self.metrics.queued.labels(model.key).inc()
        started = self.clock.now()
        try:
            self._ensure_wake(model)
            probing = self._probing.get(model.key)
            if probing is None or probing.done():
                self._probing[model.key] = asyncio.create_task(self._probe_starting(model))
            if not await wait_for_event(model.ready, within=model.cold_start_s, clock=self.clock):
                why = model.reason or "no replica became ready"
                raise GatewayError(
                    503,
                    f"model {model.key} did not become ready within {model.cold_start_s:g}s: {why}",
                    type="service_unavailable",
                    code="cold_start_timeout",
                    retry_after_s=RETRY_AFTER_COLD_START_S,
                )
        finally:
            model.held -= 1
            self.metrics.queued.labels(model.key).dec()
        if not model.endpoints and model.cannot_start:
            raise _cannot_start(model)
        if not model.endpoints:  # woken by the model's deletion, or its replica went away
            raise GatewayError(
                503,
                f"model {model.key} has no ready replica: {model.reason or 'it was deleted'}",
                type="service_unavailable",
                code="no_replica",
                retry_after_s=RETRY_AFTER_QUEUE_FULL_S,
            )
        waited = self.clock.now() - started
        self.metrics.queue_wait.labels(model.key).observe(waited)
        self.metrics.cold_start_duration.labels(model.key).observe(waited)
        self._tell_wake(model)

    def _tell_wake(self, model: Model) -> None:
        """The first held request to get a replica tells the wake workflow it is done
        (once per wake this gateway started or joined)."""
        start = self._starting.pop(model.key, None)
        if start is not None:
            task = asyncio.create_task(self._signal_ready(model, start))
            task.add_done_callback(_log_failure)

    async def _signal_ready(self, model: Model, start: asyncio.Task[str | None]) -> None:
        try:
            run_id = await start
        except Exception:
            return  # its failure is logged by its own callback
        if run_id is None:
            return  # no wake was started: nothing to tell
        for attempt in range(1, READY_SIGNAL_ATTEMPTS + 1):
            try:
                await tell_replica_ready(
                    self.client,
                    deployment=model.ref(cluster=self.cluster),
                    run_id=run_id,
                    rpc_timeout=TEMPORAL_RPC_TIMEOUT,
                )
                return
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:  # it already finished
                    return
                if attempt == READY_SIGNAL_ATTEMPTS:
                    raise  # the wake also ends by itself once it lists a ready pod
                await self.clock.sleep(WAKE_RETRY_START_S * attempt)


def _cannot_start(model: Model) -> GatewayError:
    return GatewayError(
        503,
        f"model {model.key} cannot start: {model.cannot_start}",
        type="service_unavailable",
        code="cannot_start",
        retry_after_s=RETRY_AFTER_COLD_START_S,
    )


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("starting or telling the wake workflow failed: %s", task.exception())
