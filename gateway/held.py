"""The gateway-wide budget of request bytes held in the gateway.

A request is held while its model has no ready replica (cold start, up to the
model's `coldStartTimeout`) and while every replica it may use has all its slots
taken. Each model bounds its cold-start queue in requests (`maxQueuedRequests`),
but a request may carry up to 8 MiB and there may be many models, so the bodies
held at once are also bounded in bytes, over the whole gateway: past the budget a
request that would have to wait is refused at once with 429 and Retry-After
(`kama gateway --max-held-bytes`, 256 MiB by default). Requests that find a free
slot are not held and never refused here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Gauge

from gateway.errors import GatewayError

DEFAULT_MAX_HELD_BYTES = 256 * 1024 * 1024
RETRY_AFTER_HELD_FULL_S = 5


class HeldBytes:
    def __init__(self, *, limit: int, gauge: Gauge | None = None) -> None:
        self.limit = limit
        self.held = 0
        self._gauge = gauge

    @contextmanager
    def hold(self, size: int) -> Iterator[None]:
        """Count `size` bytes as held for the duration; GatewayError 429 if they do
        not fit in the budget."""
        if self.held + size > self.limit:
            raise GatewayError(
                429,
                f"the gateway already holds {self.held} bytes of requests waiting for a "
                f"replica (at most {self.limit}); retry later",
                type="rate_limit_error",
                code="held_bytes_full",
                retry_after_s=RETRY_AFTER_HELD_FULL_S,
            )
        self._count(size)
        try:
            yield
        finally:
            self._count(-size)

    def _count(self, size: int) -> None:
        self.held += size
        if self._gauge is not None:
            self._gauge.set(self.held)
