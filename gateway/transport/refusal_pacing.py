"""Clients that keep being refused are slowed down, not answered as fast as they ask.

A 429 is cheap, but not free: each one is a request the front parses, the key check
authenticates and the proxy (for a full queue) reads and parses the body of. A tenant
that ignores `Retry-After` and asks again at once, from a few dozen connections, had
the gateway refuse 1,700 requests a second, and that CPU came out of every other
tenant's latency (`tests/bench/bench_hostile_tenants.py`). So the gateway counts the
refusals of each requester over one-second windows: a key's 429s, and an address's
401s and 429s from the head (no key, a bad one, too many requests at once). Once a
requester had more than `PACE_AFTER` in the current or the last window, a keyed
request waits `PACE_DELAY_S` before its body is read, and a refusal from the head
waits as long before it is answered: its connections ask at most a few times a
second. An honest requester, refused now and then, never waits, and a keyed client
behind the same address as a key-less flood (a load balancer that does not keep
addresses) is not slowed by it. The waits are timers, not work; at most `MAX_PACED`
requests wait at once (past that, none waits), and at most `MAX_REQUESTERS` are
counted in a window (past that, new ones go uncounted). Pure bookkeeping: the front
awaits the delay it is given."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

PACE_AFTER: Final = 20  # 429s in a one-second window before a requester is paced
PACE_DELAY_S: Final = 0.25
WINDOW_S: Final = 1.0
MAX_PACED: Final = 4096
MAX_REQUESTERS: Final = 65536


@dataclass
class RefusalPacing:
    """The 429s counted per requester, and the delay its next request waits."""

    pace_after: int = PACE_AFTER
    delay_s: float = PACE_DELAY_S
    max_paced: int = MAX_PACED
    max_requesters: int = MAX_REQUESTERS
    paced: int = 0  # requests waiting now
    _window: float = 0.0  # when the current window began
    _current: dict[str, int] = field(default_factory=dict)
    _last: dict[str, int] = field(default_factory=dict)

    def _roll(self, now: float) -> None:
        if now - self._window >= 2 * WINDOW_S:
            self._last, self._current = {}, {}
            self._window = now
        elif now - self._window >= WINDOW_S:
            self._last, self._current = self._current, {}
            self._window += WINDOW_S

    def refused(self, requester: str, *, now: float) -> None:
        """`requester` was answered 429 at `now`."""
        self._roll(now)
        if requester not in self._current and len(self._current) >= self.max_requesters:
            return  # as many requesters as are counted: this one goes uncounted
        self._current[requester] = self._current.get(requester, 0) + 1

    def delay(self, requester: str, *, now: float) -> float:
        """How long `requester`'s next request waits before it is looked at (0: not)."""
        self._roll(now)
        refusals = max(self._current.get(requester, 0), self._last.get(requester, 0))
        if refusals <= self.pace_after or self.paced >= self.max_paced:
            return 0.0
        return self.delay_s
