"""Time as a parameter of the serving runtime's waits: how long a readiness probe is
held while llama-server loads, and how long a drain waits for busy slots. Production
passes the monotonic clock; tests pass a clock they step, so they assert when a wait
ended (on that clock) without sleeping on a real one that a loaded machine stretches."""

from __future__ import annotations

import time
from typing import Final, Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a clock that never goes back (only differences mean anything)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Return once `seconds` have passed on this clock."""
        ...


class MonotonicClock:
    """The real clock: `time.monotonic` and `time.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


MONOTONIC: Final = MonotonicClock()
