"""A clock the unit tests step: `sleep` moves it on at once, so a test asserts when a
wait ended on it (exactly) without waiting on a real clock that a loaded machine
stretches (`runtime.clock.Clock`). It counts whole nanoseconds from zero, so sums of
steps compare exactly with the constants they add up to."""

from __future__ import annotations

import threading

NS_PER_S = 1_000_000_000


class SteppedClock:
    def __init__(self) -> None:
        self._ns = 0
        self._lock = threading.Lock()
        self.sleeps: list[float] = []

    def now(self) -> float:
        with self._lock:
            return self._ns / NS_PER_S

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self._ns += round(seconds * NS_PER_S)
