"""Per-key limits: requests and tokens per minute, as a sliding-window counter, and
requests in progress at once.

Each limit keeps two numbers, the count of the current minute and of the one before,
and estimates the last 60 s as `previous * (1 - elapsed / 60) + current` (the
approximation Cloudflare describes in "How we built rate limiting capable of scaling
to millions of domains"): constant memory per key, no burst of twice the limit at a
minute's edge as a fixed window allows, and a `Retry-After` computed from the same
formula. Requests are counted when admitted. Tokens are known only when an answer
ends, so a request reserves what it may use when it is admitted (`reserve`: its
`max_tokens` and its prompt, as the gateway bounds them, and at most what the budget
has left) and the reservation is settled to what the answer states when it ends
(`settle`); a request that finds nothing left is refused. So N requests at once cannot
take N times the budget, and an answer cut short (which states no usage) keeps its
reservation.

`concurrent` caps the key's requests in progress (`enter`/`leave`).

State exists only for keys the gateway knows (`gateway.auth` drops it with the key),
and time is a parameter, so tests step it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

WINDOW_S = 60.0


@dataclass(slots=True)
class SlidingWindow:
    """One limit's counts: this minute's and the previous one's."""

    limit: int
    started: float = 0.0  # start of the current minute
    current: int = 0
    previous: int = 0

    def _advance(self, now: float) -> float:
        """Move to the minute `now` is in; the seconds elapsed in it."""
        elapsed = now - self.started
        if elapsed >= WINDOW_S:
            minutes = int(elapsed // WINDOW_S)
            self.previous = self.current if minutes == 1 else 0
            self.current = 0
            self.started += minutes * WINDOW_S
            elapsed = now - self.started
        return elapsed

    def estimate(self, now: float) -> float:
        """Use in the last 60 s, as estimated."""
        elapsed = self._advance(now)
        return self.previous * (1 - elapsed / WINDOW_S) + self.current

    def retry_after(self, now: float, *, cost: int) -> int:
        """Whole seconds until `cost` more fits (0: it fits now)."""
        elapsed = self._advance(now)
        room = self.limit - cost
        if self.previous * (1 - elapsed / WINDOW_S) + self.current <= room:
            return 0
        if room < 0:  # more than a whole window allows: the next window, once empty
            return math.ceil(2 * WINDOW_S - elapsed)
        if self.current <= room and self.previous:  # later in this minute
            wait = WINDOW_S * (1 - (room - self.current) / self.previous) - elapsed
        else:  # in the next minute, where this one's count is the previous
            into_next = WINDOW_S * (1 - room / self.current) if self.current else 0.0
            wait = WINDOW_S - elapsed + into_next
        return max(1, math.ceil(wait))

    def add(self, now: float, amount: int) -> None:
        self._advance(now)
        self.current += amount

    def settle(self, now: float, amount: int) -> None:
        """Add `amount`, which may be negative (a reservation given back in part)."""
        self._advance(now)
        self.current = max(0, self.current + amount)


@dataclass(frozen=True, slots=True)
class LimitValues:
    """A key's limits as configured (None: not set)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent: int | None = None


@dataclass(slots=True)
class KeyLimits:
    """The limits of one key (None: that limit is not set), and its requests in
    progress."""

    requests: SlidingWindow | None
    tokens: SlidingWindow | None
    concurrent: int | None = None
    in_progress: int = 0

    @classmethod
    def create(cls, values: LimitValues, *, now: float) -> KeyLimits:
        return cls(
            requests=_window(values.requests_per_minute, now),
            tokens=_window(values.tokens_per_minute, now),
            concurrent=values.concurrent,
        )

    def reconfigure(self, values: LimitValues, *, now: float) -> None:
        """The key's limits changed: keep what was counted under a limit that stays."""
        self.requests = _rewindow(self.requests, values.requests_per_minute, now)
        self.tokens = _rewindow(self.tokens, values.tokens_per_minute, now)
        self.concurrent = values.concurrent

    def admit(self, now: float) -> tuple[str, int] | None:
        """Count one request if every limit allows it (a token budget needs a token
        left, the concurrency cap a free place); else the limit that refused it
        ("requests", "tokens" or "concurrency") and the seconds until it might not."""
        if self.concurrent is not None and self.in_progress >= self.concurrent:
            return "concurrency", 1
        if self.tokens is not None and (wait := self.tokens.retry_after(now, cost=1)):
            return "tokens", wait
        if self.requests is not None:
            if wait := self.requests.retry_after(now, cost=1):
                return "requests", wait
            self.requests.add(now, 1)
        return None

    @property
    def requests_limit(self) -> int | None:
        return None if self.requests is None else self.requests.limit

    @property
    def tokens_limit(self) -> int | None:
        return None if self.tokens is None else self.tokens.limit

    def enter(self) -> None:
        self.in_progress += 1

    def leave(self) -> None:
        self.in_progress = max(0, self.in_progress - 1)

    def reserve(self, now: float, tokens: int | None) -> tuple[int, int]:
        """Reserve `tokens` (None: as many as there are), at most what the budget has
        left: (reserved, 0), or (0, seconds until a token is free) when nothing is
        left. Only one request at a time can get less than it asked for (the budget
        is then empty), so the budget is overshot by at most that one's excess."""
        if self.tokens is None or tokens == 0:
            return 0, 0
        window = self.tokens
        room = math.floor(window.limit - window.estimate(now))
        if room < 1:
            return 0, window.retry_after(now, cost=1)
        cost = room if tokens is None else min(tokens, room)
        window.add(now, cost)
        return cost, 0

    def settle(self, now: float, *, reserved: int, used: int) -> None:
        """The answer used `used` tokens of the `reserved` it was admitted with."""
        if self.tokens is not None and used != reserved:
            self.tokens.settle(now, used - reserved)


@dataclass(frozen=True, slots=True)
class KeyCeilings:
    """The operator's ceilings on what a key of a namespace may set: `namespaces`
    for the namespaces named there, `default` for every other one."""

    default: LimitValues = LimitValues()
    namespaces: dict[str, LimitValues] = field(default_factory=dict)

    def cap(self, namespace: str, values: LimitValues) -> LimitValues:
        """A key's limits under its namespace's ceilings: the lower of each, and the
        ceiling where the key sets none."""
        ceiling = self.namespaces.get(namespace, self.default)
        return LimitValues(
            requests_per_minute=_lower(values.requests_per_minute, ceiling.requests_per_minute),
            tokens_per_minute=_lower(values.tokens_per_minute, ceiling.tokens_per_minute),
            concurrent=_lower(values.concurrent, ceiling.concurrent),
        )

    @classmethod
    def parse(cls, document: Mapping[str, Any]) -> KeyCeilings:
        """From the chart's `gateway.auth.keyCeilings` (KAMA_GATEWAY_KEY_CEILINGS, as
        JSON): `{"default": {...}, "namespaces": {"<ns>": {...}}}`, each with
        `requestsPerMinute`, `tokensPerMinute`, `maxConcurrentRequests` (positive
        integers, all optional). ValueError naming what is wrong."""
        unknown = set(document) - {"default", "namespaces"}
        if unknown:
            raise ValueError(f"key ceilings: unknown fields {sorted(unknown)}")
        namespaces = document.get("namespaces") or {}
        if not isinstance(namespaces, Mapping):
            raise ValueError("key ceilings: namespaces must map a namespace to its ceilings")
        return cls(
            default=_values(document.get("default") or {}, where="default"),
            namespaces={
                str(ns): _values(values, where=f"namespaces.{ns}")
                for ns, values in namespaces.items()
            },
        )


_CEILING_FIELDS = {
    "requestsPerMinute": "requests_per_minute",
    "tokensPerMinute": "tokens_per_minute",
    "maxConcurrentRequests": "concurrent",
}


def _values(document: object, *, where: str) -> LimitValues:
    if not isinstance(document, Mapping):
        raise ValueError(f"key ceilings: {where} must be an object")
    unknown = set(document) - set(_CEILING_FIELDS)
    if unknown:
        raise ValueError(f"key ceilings: {where} has unknown fields {sorted(unknown)}")
    values: dict[str, int] = {}
    for name, attribute in _CEILING_FIELDS.items():
        value = document.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"key ceilings: {where}.{name} must be a positive integer")
        values[attribute] = value
    return LimitValues(**values)


def _lower(own: int | None, ceiling: int | None) -> int | None:
    if own is None:
        return ceiling
    return own if ceiling is None else min(own, ceiling)


def _window(limit: int | None, now: float) -> SlidingWindow | None:
    return None if limit is None else SlidingWindow(limit=limit, started=now)


def _rewindow(window: SlidingWindow | None, limit: int | None, now: float) -> SlidingWindow | None:
    if limit is None:
        return None
    if window is None:
        return SlidingWindow(limit=limit, started=now)
    window.limit = limit
    return window
