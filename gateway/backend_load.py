"""How busy each replica is with other gateways' requests: llama-server's own
`llamacpp:requests_processing` + `llamacpp:requests_deferred` from its `/metrics`,
polled at a bounded rate (one request per endpoint per interval), minus this
gateway's own in-flight requests there, which it counts exactly. Only models with two
or more replicas are polled: with one there is no choice for the load to inform.
Each poll has a total deadline and a byte cap (`activities.pod_reads`): a
replica that drips its answer costs one poll interval, not the poller. `/metrics`
requires the replica's llama-server key when Kama has a master key
(`Endpoint.authorization`)."""

from __future__ import annotations

import asyncio
import logging

import httpx

from activities.pod_reads import read_pod
from gateway.registry import Endpoint, ModelRegistry
from kama.serving_plan import LLAMA_PORT

log = logging.getLogger("kama.gateway")

POLL_INTERVAL_S = 0.5
POLL_TIMEOUT_S = 0.5  # the whole answer, from the request to its last byte
POLL_MAX_BYTES = 1024 * 1024


def parse_llama_metrics(text: str) -> tuple[int, int]:
    """(processing, deferred) from llama-server's Prometheus text."""
    values = {"llamacpp:requests_processing": 0.0, "llamacpp:requests_deferred": 0.0}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        if name in values:
            try:
                values[name] = float(value.split()[0])
            except (ValueError, IndexError):
                continue
    return int(values["llamacpp:requests_processing"]), int(values["llamacpp:requests_deferred"])


async def poll_one(http: httpx.AsyncClient, endpoint: Endpoint, *, port: int = LLAMA_PORT) -> None:
    """One poll of one replica. It goes around the registry's leases, so it is not
    held back by the replica's slot cap (it takes one of llama-server's spare HTTP
    threads, of which the runtime keeps a few beyond the slots)."""
    before = endpoint.in_flight
    url = f"http://{endpoint.ip}:{port}/metrics"
    try:
        answer = await read_pod(
            http,
            url,
            deadline_s=POLL_TIMEOUT_S,
            max_bytes=POLL_MAX_BYTES,
            authorization=None
            if endpoint.authorization is None
            else endpoint.authorization.decode("latin-1"),
        )
    except httpx.HTTPError as exc:
        log.debug("polling %s failed: %r", url, exc)
        return
    if answer.status == 200:
        processing, deferred = parse_llama_metrics(answer.text)
        endpoint.observe_backend(held=processing + deferred, ours=max(before, endpoint.in_flight))


async def poll_backend_load(*, registry: ModelRegistry, http: httpx.AsyncClient) -> None:
    while True:
        endpoints = [
            e
            for m in list(registry.models.values())
            if len(m.endpoints) >= 2
            for e in m.endpoints.values()
        ]
        if endpoints:
            await asyncio.gather(*(poll_one(http, e) for e in endpoints))
        await asyncio.sleep(POLL_INTERVAL_S)
