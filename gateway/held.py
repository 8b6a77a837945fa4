"""What bounds the gateway's memory whatever clients do, and the byte budgets that
enforce it.

A request costs the gateway its body (up to 8 MiB) from its first byte to its end.
Each way a client could make the gateway keep many of them has its bound, set on
`kama gateway` (`GatewayLimits`):

- bodies arriving: every body being received counts against one budget
  (`--max-upload-bytes`; its declared length before anything is read, a chunked
  body as its chunks arrive); past it the request is refused 429 with Retry-After;
- bodies waiting: a request is held while its model has no ready replica (cold
  start, up to the model's `coldStartTimeout`) and while every replica it may use
  has all its slots taken. Their bodies share one budget (`--max-held-bytes`);
  only the raw body is kept while a request waits (never its parsed JSON, which
  can cost several times its size), so the budget counts what is held. Past it a
  request that would have to wait gets 429; requests that find a free slot are not
  held and never refused here. The waiting requests are also capped in number, per
  model (its `maxQueuedRequests`, for a cold start and for a slot alike) and over
  the gateway (`--max-waiting-requests`);
- bodies in flight to a replica: at most its slots per replica (`gateway.routing`);
- one client: at most `--max-requests-per-client` requests in progress from one
  address at once (HTTP/1.1 carries one request at a time per connection, so this
  caps its busy connections); past it 429;
- answers a client does not read: granian's RSGI stream takes whatever it is given
  without back-pressure, and a connection keeps one answer until the client reads
  it (the next request on it is not read before), so the public port's sockets
  carry a kernel write timeout (`--client-write-timeout`, TCP_USER_TIMEOUT): a
  client that reads nothing for that long has its connection aborted, and the
  answer it held is freed (a stream being relayed to it then stops, and its
  replica's request is closed);
- answers a client reads slowly: what each client has not taken is measured from
  the kernel (`gateway.transport.unread_answers`): a stream waits while its client
  owes `--max-unread-bytes-per-connection` (its replica's answer waits with it), and
  is aborted after `--unread-stall` without room; past `--max-unread-bytes` over
  all clients the largest debtors' connections are aborted; a request is ended
  `--answer-deadline` after it arrived."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from prometheus_client import Gauge

from gateway.errors import GatewayError
from gateway.transport.front import (
    DEFAULT_ANSWER_DEADLINE_S,
    DEFAULT_MAX_REQUESTS_PER_CLIENT,
    DEFAULT_MAX_UPLOAD_BYTES,
)
from gateway.transport.unread_answers import (
    DEFAULT_PER_CONNECTION_BYTES,
    DEFAULT_STALL_S,
    DEFAULT_TOTAL_BYTES,
    UnreadLimits,
)

DEFAULT_MAX_HELD_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_WAITING_REQUESTS = 1024
DEFAULT_CLIENT_WRITE_TIMEOUT_S = 30.0
DEFAULT_NAMESPACE_SHARE = 0.5  # of the waiting budgets, per namespace (gateway.namespace_shares)
RETRY_AFTER_HELD_FULL_S = 5


@dataclass(frozen=True)
class GatewayLimits:
    """The memory bounds of one gateway process (see the module's docstring)."""

    max_held_bytes: int = DEFAULT_MAX_HELD_BYTES
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS
    max_requests_per_client: int = DEFAULT_MAX_REQUESTS_PER_CLIENT  # 0: no cap
    client_write_timeout_s: float = DEFAULT_CLIENT_WRITE_TIMEOUT_S  # 0: the kernel's
    namespace_share: float = DEFAULT_NAMESPACE_SHARE  # 1: no per-namespace share
    # what clients have not taken of their answers (gateway.transport.unread_answers)
    max_unread_bytes_per_connection: int = DEFAULT_PER_CONNECTION_BYTES
    max_unread_bytes: int = DEFAULT_TOTAL_BYTES
    unread_stall_s: float = DEFAULT_STALL_S
    answer_deadline_s: float = DEFAULT_ANSWER_DEADLINE_S  # 0: none

    def unread(self) -> UnreadLimits:
        return UnreadLimits(
            per_connection=self.max_unread_bytes_per_connection,
            total=self.max_unread_bytes,
            stall_s=self.unread_stall_s,
        )


DEFAULT_LIMITS = GatewayLimits()


class ByteBudget:
    """Bytes counted while something holds them, refused with 429 past `limit`."""

    def __init__(
        self,
        *,
        limit: int,
        gauge: Gauge | None = None,
        holding: str = "requests waiting for a replica",
        code: str = "held_bytes_full",
        retry_after_s: int = RETRY_AFTER_HELD_FULL_S,
    ) -> None:
        self.limit = limit
        self.held = 0
        self._gauge = gauge
        self._holding = holding
        self._code = code
        self._retry_after_s = retry_after_s

    def take(self, size: int) -> None:
        """Count `size` more bytes (give them back with `give`); GatewayError 429 if
        they do not fit."""
        if self.held + size > self.limit:
            raise GatewayError(
                429,
                f"the gateway already holds {self.held} bytes of {self._holding} "
                f"(at most {self.limit}); retry later",
                type="rate_limit_error",
                code=self._code,
                retry_after_s=self._retry_after_s,
            )
        self._count(size)

    def give(self, size: int) -> None:
        self._count(-size)

    @contextmanager
    def hold(self, size: int) -> Iterator[None]:
        """Count `size` bytes as held for the duration; GatewayError 429 if they do
        not fit in the budget."""
        self.take(size)
        try:
            yield
        finally:
            self.give(size)

    def _count(self, size: int) -> None:
        self.held += size
        if self._gauge is not None:
            self._gauge.set(self.held)


HeldBytes = ByteBudget  # the held-requests budget, as the proxy names it
