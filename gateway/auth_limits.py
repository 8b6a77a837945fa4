"""Per-key limits: requests and tokens per minute, as a sliding-window counter.

Each limit keeps two numbers, the count of the current minute and of the one before,
and estimates the last 60 s as `previous * (1 - elapsed / 60) + current` (the
approximation Cloudflare describes in "How we built rate limiting capable of scaling
to millions of domains"): constant memory per key, no burst of twice the limit at a
minute's edge as a fixed window allows, and a `Retry-After` computed from the same
formula. Requests are counted when admitted. Tokens are known only when an answer
ends, so a token budget is enforced after the fact: a key whose estimate reached its
budget is refused until the estimate falls below it again.

State exists only for keys the gateway knows (`gateway.auth` drops it with the key),
and time is a parameter, so tests step it."""

from __future__ import annotations

import math
from dataclasses import dataclass

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


@dataclass(slots=True)
class KeyLimits:
    """The limits of one key (None: that limit is not set)."""

    requests: SlidingWindow | None
    tokens: SlidingWindow | None

    @classmethod
    def create(
        cls, *, requests_per_minute: int | None, tokens_per_minute: int | None, now: float
    ) -> KeyLimits:
        return cls(
            requests=_window(requests_per_minute, now),
            tokens=_window(tokens_per_minute, now),
        )

    def reconfigure(
        self, *, requests_per_minute: int | None, tokens_per_minute: int | None, now: float
    ) -> None:
        """The key's limits changed: keep what was counted under a limit that stays."""
        self.requests = _rewindow(self.requests, requests_per_minute, now)
        self.tokens = _rewindow(self.tokens, tokens_per_minute, now)

    def admit(self, now: float) -> tuple[str, int] | None:
        """Count one request if both limits allow it (a token budget needs a token
        left); else the limit that refused it ("requests" or "tokens") and the seconds
        until it would not."""
        if self.tokens is not None and (wait := self.tokens.retry_after(now, cost=1)):
            return "tokens", wait
        if self.requests is not None:
            if wait := self.requests.retry_after(now, cost=1):
                return "requests", wait
            self.requests.add(now, 1)
        return None

    def spend_tokens(self, now: float, tokens: int) -> None:
        if self.tokens is not None and tokens > 0:
            self.tokens.add(now, tokens)


def _window(limit: int | None, now: float) -> SlidingWindow | None:
    return None if limit is None else SlidingWindow(limit=limit, started=now)


def _rewindow(window: SlidingWindow | None, limit: int | None, now: float) -> SlidingWindow | None:
    if limit is None:
        return None
    if window is None:
        return SlidingWindow(limit=limit, started=now)
    window.limit = limit
    return window
