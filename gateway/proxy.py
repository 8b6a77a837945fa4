"""Forwarding one request to one replica and relaying its answer.

The replica comes from the registry as a lease (released once, in one `finally`,
whatever happens): at once if one has a free slot (with affinity keys: its home
replica, see `gateway.routing`), else after the requests already waiting for one
(with affinity keys: a bounded wait for its home first, see `gateway.registry`). A
request that would wait for its full home but may not wait (the caps below) takes a
free slot elsewhere rather than a 429. Waiting for a first replica (cold start) or for
a slot counts the body against the gateway-wide held-bytes budget (`gateway.held`),
and waiting requests are capped in number: per model at its `maxQueuedRequests` (for a slot as
for a cold start) and over the gateway at `max_waiting_requests`; past either, 429
with Retry-After. A connection that fails before anything was sent is retried on
another replica. One that refused leaves routing at once (its llama-server is gone
or restarting) and is probed (`/health`, from `REFUSED_PROBE_START_S` doubling to
`REFUSED_PROBE_MAX_S`) until it answers 200, then routed to again, unless the watch
has meanwhile said what became of its pod; one that timed out gets requests last for
a few seconds. Any later failure is the client's 502.

The answer names the model as the client asked for it (`gateway.answer_model`): a
JSON answer up to 8 MiB is read whole and sent with its top-level "model" replaced;
an event stream is relayed as it arrives, each `data:` line renamed (no more than
one line held back), an Anthropic Messages stream opening with `message_start` even
where llama-server's does not (`gateway.messages_stream`); anything else is relayed
as chunks arrive, the replica's content-length kept. If the client goes away the
front cancels the request and the unfinished upstream answer is closed, which is how
llama-server learns to stop generating. A replica that fails mid-answer: a JSON
answer (not sent yet) is a 502, a longer length-framed answer ends short (the client
sees the connection close early), and an event stream gets a last event in the OpenAI
error shape, which OpenAI clients raise.

Only the request headers named in FORWARDED_REQUEST_HEADERS reach a replica: never
the client's own credentials (`authorization`, `x-api-key`: its key to this
gateway). With a master serving key, every request to a replica carries that
replica's llama-server API key instead (`Endpoint.authorization`, see
`kama.serving_key`)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from gateway.affinity import Affinity
from gateway.answer_model import (
    MAX_DOCUMENT_BYTES,
    EventStreamRenamer,
    encoded_name,
    rename_model,
)
from gateway.api_routes import MESSAGES_ROUTE
from gateway.errors import ErrorShape, GatewayError
from gateway.held import DEFAULT_MAX_HELD_BYTES, DEFAULT_MAX_WAITING_REQUESTS, HeldBytes
from gateway.messages_stream import MessageStreamOpening
from gateway.metrics import GatewayMetrics
from gateway.namespace_shares import NamespaceShares
from gateway.registry import Endpoint, Lease, Model, ModelRegistry
from gateway.transport.exchange import HeaderLookup, Headers, Reply
from gateway.transport.upstream import UpstreamBody, UpstreamTransport
from kama.serving_plan import LLAMA_PORT

log = logging.getLogger("kama.gateway")

FORWARDED_REQUEST_HEADERS = tuple(
    (name, name.encode()) for name in ("content-type", "accept", "x-request-id")
)
DROPPED_RESPONSE_HEADERS = frozenset(
    {b"transfer-encoding", b"content-length", b"connection", b"keep-alive", b"server", b"date"}
)
CONNECT_TIMEOUT_S = 2.0
UNREACHABLE_BACKOFF_S = 5.0  # a replica whose connection timed out gets requests last
READ_TIMEOUT_S = 600.0  # for the whole head, then between two pieces of the body
REFUSED_PROBE_START_S = 0.25  # a replica that refused a connection: first probe after
REFUSED_PROBE_MAX_S = 5.0
REFUSED_PROBE_TIMEOUT_S = 1.0  # connect, and the probe's whole head
RETRY_AFTER_QUEUE_FULL_S = 5


class Holder(Protocol):
    """What the proxy needs of the wake queue: wait until a model has a replica."""

    async def hold_until_ready(self, model: Model) -> None: ...


def replica_headers(
    endpoint: Endpoint, headers: list[tuple[bytes, bytes]]
) -> list[tuple[bytes, bytes]]:
    """`headers` and the replica's llama-server key, if it has one."""
    if endpoint.authorization is None:
        return headers
    return [*headers, (b"authorization", endpoint.authorization)]


def forwarded_headers(headers: HeaderLookup) -> list[tuple[bytes, bytes]]:
    forwarded = []
    for name, raw in FORWARDED_REQUEST_HEADERS:
        value = headers.get(name)
        if value is not None:
            forwarded.append((raw, value.encode("latin-1")))
    return forwarded


@dataclass
class Proxy:
    registry: ModelRegistry
    upstream: UpstreamTransport
    waker: Holder
    replica_port: int = LLAMA_PORT
    max_held_bytes: int = DEFAULT_MAX_HELD_BYTES
    max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS
    held: HeldBytes = field(init=False)
    waiting: int = field(init=False, default=0)  # requests waiting, over all models
    slot_waiting: dict[str, int] = field(init=False, default_factory=dict)  # per model key
    namespace_share: float = 1.0  # gateway.namespace_shares
    shares: NamespaceShares = field(init=False)
    probes: set[asyncio.Task[None]] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.held = HeldBytes(limit=self.max_held_bytes, gauge=self.registry.metrics.held_bytes)
        self.shares = NamespaceShares(share=self.namespace_share)

    async def forward(
        self,
        *,
        model: Model,
        method: str,
        path: str,
        body: bytes,
        headers: HeaderLookup,
        route: str,
        reply: Reply,
        asked_as: str,
        affinity: Affinity | None = None,
        errors: ErrorShape = ErrorShape.OPENAI,
    ) -> None:
        """Answer `reply` from a replica of `model`, or raise GatewayError. The answer
        names the model `asked_as`, the name the client used; `affinity` (PrefixAffinity
        routing) ranks the replicas for this conversation."""
        started = time.monotonic()
        if not model.endpoints:
            await self._hold(model, size=len(body))
        forwarded = forwarded_headers(headers)
        tried: set[str] = set()
        held_again = False
        while True:
            lease = await self._lease(
                model, route=route, tried=tried, size=len(body), affinity=affinity
            )
            if lease is None:
                if not tried and not held_again:  # the replicas left since the hold
                    await self._hold(model, size=len(body))
                    held_again = True
                    continue
                raise GatewayError(
                    502,
                    f"no replica of {model.key} accepted the connection",
                    type="api_error",
                    code="upstream_unavailable",
                )
            tried.add(lease.endpoint.pod)
            try:
                upstream = await self._send(
                    lease, method=method, path=path, headers=forwarded, body=body
                )
                if upstream is None:
                    continue  # nothing reached that replica: another one may take it
                relay = Relay(
                    lease=lease,
                    upstream=upstream,
                    metrics=self.registry.metrics,
                    started=started,
                    asked_as=asked_as,
                    errors=errors,
                    messages=route == MESSAGES_ROUTE,
                )
                await relay.to(reply)
                return
            finally:
                lease.release()

    async def _hold(self, model: Model, *, size: int) -> None:
        """Wait for the model's first replica, its `size` bytes counted as held (the
        wake queue caps the requests held per model)."""
        refusal = self._waiting_refused(None) or self._share_refused(model, size=size)
        if refusal is not None:
            raise refusal
        with self.held.hold(size), self.shares.counted(model.namespace, size=size):
            self.waiting += 1
            try:
                await self.waker.hold_until_ready(model)
            finally:
                self.waiting -= 1

    def _share_refused(self, model: Model, *, size: int) -> GatewayError | None:
        """The 429 when `model`'s namespace has used its share of the waiting budgets."""
        return self.shares.refusal(
            model.namespace,
            size=size,
            max_waiting=self.max_waiting_requests,
            max_held=self.held.limit,
        )

    def _waiting_refused(self, model: Model | None) -> GatewayError | None:
        """The 429 for one more waiting request (the gateway's cap, and with `model`
        its cap on requests waiting for a slot), or None if the request may wait."""
        if self.waiting >= self.max_waiting_requests:
            return _queue_full(
                f"the gateway already has {self.waiting} requests waiting "
                f"(at most {self.max_waiting_requests})"
            )
        if model is not None and self.slot_waiting.get(model.key, 0) >= model.max_queued:
            return _queue_full(
                f"model {model.key} has every slot taken and {model.max_queued} requests "
                "waiting for one (its maxQueuedRequests)"
            )
        return None

    async def _lease(
        self,
        model: Model,
        *,
        route: str,
        tried: set[str],
        size: int,
        affinity: Affinity | None = None,
    ) -> Lease | None:
        """A replica with a free slot, at once or after the requests already waiting
        for one (see `ModelRegistry.wait_for_slot`, the wait counted as held bytes);
        None if none is left to try."""
        registry = self.registry
        if not model.slot_waiters:
            lease = registry.acquire(
                model, route=route, exclude=tried, now=time.monotonic(), affinity=affinity
            )
            if lease is not None:
                return lease
        if not registry.can_wait(model, exclude=tried):
            return None
        refusal = self._waiting_refused(model) or self._share_refused(model, size=size)
        if refusal is not None:
            if affinity is not None:  # it would have waited for its home: any free slot
                lease = registry.acquire(
                    model,
                    route=route,
                    exclude=tried,
                    now=time.monotonic(),
                    affinity=affinity,
                    wait_for_home=False,
                )
                if lease is not None:
                    return lease
            raise refusal
        waiting = registry.metrics.slot_waiting.labels(model.key)
        with self.held.hold(size), self.shares.counted(model.namespace, size=size):
            waiting.inc()
            self.waiting += 1
            self.slot_waiting[model.key] = self.slot_waiting.get(model.key, 0) + 1
            try:
                return await registry.wait_for_slot(
                    model, route=route, exclude=tried, affinity=affinity
                )
            finally:
                waiting.dec()
                self.waiting -= 1
                left = self.slot_waiting[model.key] - 1
                if left:
                    self.slot_waiting[model.key] = left
                else:
                    del self.slot_waiting[model.key]

    async def _send(
        self,
        lease: Lease,
        *,
        method: str,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> UpstreamBody | None:
        """The replica's answer once its head is in; None if the connection failed
        before anything was sent (safe to try another replica)."""
        model, endpoint = lease.model, lease.endpoint
        errors = self.registry.metrics.upstream_errors
        sent = time.monotonic()
        try:
            upstream = await self.upstream.request(
                host=endpoint.ip,
                port=self.replica_port,
                method=method,
                target=path,
                headers=replica_headers(endpoint, headers),
                body=body,
                connect_timeout=CONNECT_TIMEOUT_S,
                read_timeout=READ_TIMEOUT_S,
            )
        except httpx.ConnectTimeout:
            # slow, not gone (an overloaded node): others first for a while
            errors.labels(model.key, "connect_timeout").inc()
            endpoint.unreachable_until = time.monotonic() + UNREACHABLE_BACKOFF_S
            log.warning("connecting to %s of %s timed out", endpoint.pod, model.key)
            return None
        except httpx.ConnectError as exc:
            # refused: its llama-server is gone or restarting; the watch may say so
            errors.labels(model.key, "connect").inc()
            self._set_aside(model, endpoint)
            log.warning("%s of %s refused the connection: %s", endpoint.pod, model.key, exc)
            return None
        except httpx.HTTPError as exc:
            errors.labels(model.key, type(exc).__name__).inc()
            log.warning("%s of %s failed before answering: %r", endpoint.pod, model.key, exc)
            raise GatewayError(
                502, f"replica {endpoint.pod} failed: {type(exc).__name__}", type="api_error"
            ) from None
        endpoint.observe_latency(time.monotonic() - sent)
        return upstream

    def _set_aside(self, model: Model, endpoint: Endpoint) -> None:
        """Take a replica that refused a connection out of routing, as a starting one,
        and probe it until it answers again (see `_probe_refused`)."""
        if model.endpoints.get(endpoint.pod) is not endpoint:
            return  # set aside already, or the watch replaced it
        self.registry.drop_endpoint(model, endpoint)
        model.starting[endpoint.pod] = endpoint
        probe = asyncio.create_task(self._probe_refused(model, endpoint))
        self.probes.add(probe)
        probe.add_done_callback(self.probes.discard)

    async def _probe_refused(self, model: Model, endpoint: Endpoint) -> None:
        """Ask the replica's `/health` (back-off from REFUSED_PROBE_START_S doubling to
        REFUSED_PROBE_MAX_S) until it answers 200, then route to it again; stop if the
        watch moved or removed the pod meanwhile (it has its own endpoint then)."""
        delay = REFUSED_PROBE_START_S
        while True:
            await asyncio.sleep(delay)
            if (
                model.starting.get(endpoint.pod) is not endpoint
                or self.registry.models.get(model.key) is not model
            ):
                return
            try:
                answer = await self.upstream.request(
                    host=endpoint.ip,
                    port=self.replica_port,
                    method="GET",
                    target="/health",  # public in llama-server; the key anyway
                    headers=replica_headers(endpoint, []),
                    body=b"",
                    connect_timeout=REFUSED_PROBE_TIMEOUT_S,
                    read_timeout=REFUSED_PROBE_TIMEOUT_S,
                )
            except httpx.HTTPError:
                delay = min(delay * 2, REFUSED_PROBE_MAX_S)
                continue
            await answer.aclose()  # unread: the connection closes, nothing is kept
            if answer.status == 200 and model.starting.get(endpoint.pod) is endpoint:
                log.info("%s of %s answers again: routed to again", endpoint.pod, model.key)
                self.registry.confirm_early(model, endpoint.pod)
                return
            delay = min(delay * 2, REFUSED_PROBE_MAX_S)


@dataclass
class Relay:
    """One replica's answer, relayed to one client, naming the model as it asked."""

    lease: Lease
    upstream: UpstreamBody
    metrics: GatewayMetrics
    started: float
    asked_as: str
    errors: ErrorShape = ErrorShape.OPENAI  # the shape of an error the relay adds
    messages: bool = False  # an Anthropic Messages answer: a stream opens with message_start

    def response_headers(self) -> tuple[Headers, str | None]:
        """The replica's headers to pass on, and its content-length if it sent one."""
        headers: Headers = []
        length = None
        for name, value in self.upstream.headers:
            lower = name.lower()
            if lower == b"content-length":
                length = value.decode("latin-1")
            elif lower not in DROPPED_RESPONSE_HEADERS:
                headers.append((lower.decode("latin-1"), value.decode("latin-1")))
        headers.append(("x-kama-pod", self.lease.endpoint.pod))
        headers.append(("x-kama-model", self.lease.model.key))
        return headers, length

    async def to(self, reply: Reply) -> None:
        series = self.lease.series
        headers, length = self.response_headers()
        events = _content_type(headers, "text/event-stream")
        renamer = EventStreamRenamer(name=self.asked_as) if events else None
        opening = MessageStreamOpening(model=self.asked_as) if events and self.messages else None
        try:
            whole = self.upstream.take_whole_body()
            if whole is None and _document(headers, length):
                series.ttft.observe(time.monotonic() - self.started)
                whole = b"".join([chunk async for chunk in self.upstream])
            elif whole is not None:  # a short answer that is all here: one write
                series.ttft.observe(time.monotonic() - self.started)
            if whole is not None:
                if renamer is not None:
                    whole = _opened(opening, renamer.feed(whole) + renamer.close(), last=True)
                elif _content_type(headers, "application/json"):
                    whole = rename_model(whole, encoded_name(self.asked_as))
                reply.send(self.upstream.status, headers, whole)
                return
            if length is not None and renamer is None:
                headers.append(("content-length", length))
            reply.start(self.upstream.status, headers)
            first = True
            async for chunk in self.upstream:
                if first:
                    series.ttft.observe(time.monotonic() - self.started)
                    first = False
                piece = chunk if renamer is None else _opened(opening, renamer.feed(chunk))
                if piece:
                    await reply.write(piece)
            if renamer is not None and (rest := _opened(opening, renamer.close(), last=True)):
                await reply.write(rest)
        except httpx.HTTPError as exc:
            self.metrics.upstream_errors.labels(self.lease.model.key, type(exc).__name__).inc()
            log.warning(
                "replica %s of %s failed mid-answer: %r",
                self.lease.endpoint.pod,
                self.lease.model.key,
                exc,
            )
            if not reply.status:  # a JSON answer read whole: nothing sent yet
                raise self._error(exc) from None
            if renamer is not None:  # what had arrived, then the error as the last event
                rest = _opened(opening, renamer.close(), last=True)
                await reply.write(rest + self._error_event(exc))
        finally:
            await self.upstream.aclose()
            series.duration.observe(time.monotonic() - self.started)

    def _error(self, exc: httpx.HTTPError) -> GatewayError:
        return GatewayError(
            502,
            f"replica {self.lease.endpoint.pod} failed mid-answer: {type(exc).__name__}",
            type="api_error",
            code="upstream_failed",
        )

    def _error_event(self, exc: httpx.HTTPError) -> bytes:
        return self._error(exc).event(self.errors)


def _opened(opening: MessageStreamOpening | None, piece: bytes, *, last: bool = False) -> bytes:
    """`piece` of an event stream through a Messages stream's opening, if it has one
    (`last`: the stream's end, with whatever the opening still held)."""
    if opening is None:
        return piece
    piece = opening.feed(piece)
    return piece + opening.close() if last else piece


def _queue_full(why: str) -> GatewayError:
    return GatewayError(
        429,
        f"{why}; retry later",
        type="rate_limit_error",
        code="queue_full",
        retry_after_s=RETRY_AFTER_QUEUE_FULL_S,
    )


def _content_type(headers: Headers, kind: str) -> bool:
    return any(name == "content-type" and v.startswith(kind) for name, v in headers)


def _document(headers: Headers, length: str | None) -> bool:
    """A JSON answer small enough to be read whole, so its model can be renamed."""
    return (
        length is not None
        and length.isdigit()
        and int(length) <= MAX_DOCUMENT_BYTES
        and _content_type(headers, "application/json")
    )
