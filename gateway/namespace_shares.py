"""Each namespace's share of the gateway's waiting budgets, so that one tenant's flood
leaves the others theirs.

Requests that wait (for a cold start, or for a free slot) are capped in number over
the gateway (`--max-waiting-requests`) and their bodies in bytes (`--max-held-bytes`).
Without shares one tenant could take both whole and every other tenant's requests
would get 429. With a share `s` (`--namespace-share`, 0.5 by default), the requests
waiting for the models of one namespace may take at most `s` of each budget; what a
namespace does not use is everybody's. The namespace is the model's: its queue is the
one being filled. A share of 1 turns this off."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gateway.errors import GatewayError
from gateway.held import RETRY_AFTER_HELD_FULL_S

RETRY_AFTER_SHARE_S = 5


@dataclass
class NamespaceShares:
    share: float = 1.0
    waiting: dict[str, int] = field(default_factory=dict)  # requests waiting, per namespace
    held: dict[str, int] = field(default_factory=dict)  # their body bytes, per namespace

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise ValueError(f"a namespace's share must be in (0, 1], not {self.share}")

    def refusal(
        self, namespace: str, *, size: int, max_waiting: int, max_held: int
    ) -> GatewayError | None:
        """The 429 for one more request of `size` bytes waiting in `namespace`, or None
        if its share has room for it."""
        if self.share >= 1:
            return None
        most = max(1, int(max_waiting * self.share))
        waiting = self.waiting.get(namespace, 0)
        if waiting >= most:
            return GatewayError(
                429,
                f"namespace {namespace} already has {waiting} requests waiting (at most "
                f"{most}, its share of the gateway's {max_waiting}); retry later",
                type="rate_limit_error",
                code="queue_full",
                retry_after_s=RETRY_AFTER_SHARE_S,
            )
        most_bytes = int(max_held * self.share)
        held = self.held.get(namespace, 0)
        if held + size > most_bytes:
            return GatewayError(
                429,
                f"requests waiting for models of namespace {namespace} already hold {held} "
                f"bytes (at most {most_bytes}, its share of the gateway's {max_held}); "
                "retry later",
                type="rate_limit_error",
                code="held_bytes_full",
                retry_after_s=RETRY_AFTER_HELD_FULL_S,
            )
        return None

    @contextmanager
    def counted(self, namespace: str, *, size: int) -> Iterator[None]:
        """One request of `size` bytes waiting in `namespace` for the duration."""
        self.waiting[namespace] = self.waiting.get(namespace, 0) + 1
        self.held[namespace] = self.held.get(namespace, 0) + size
        try:
            yield
        finally:
            _decrease(self.waiting, namespace, 1)
            _decrease(self.held, namespace, size)


def _decrease(counts: dict[str, int], namespace: str, amount: int) -> None:
    left = counts.get(namespace, 0) - amount
    if left > 0:
        counts[namespace] = left
    else:
        counts.pop(namespace, None)
