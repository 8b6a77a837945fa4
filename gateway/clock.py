"""Time as a parameter of the gateway's timing decisions: the demand reporter (when a
report goes out, how long a rise waited), the wake queue (retries, the cold-start
timeout, how long a request was held), the KEDA demand cache, the KEDA scaler's stream
(when it checks again without a rise) and the registry (how long a request waits for
its home replica) each take a `Clock`.
Production passes the monotonic clock; tests pass a clock they step, so they assert
exact times without sleeping on real ones."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final, Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a clock that never goes back (only differences mean anything)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once `seconds` have passed on this clock."""
        ...


class MonotonicClock:
    """The real clock: `time.monotonic` and `asyncio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


MONOTONIC: Final = MonotonicClock()


async def wait_for_event(event: asyncio.Event, *, within: float, clock: Clock) -> bool:
    """Wait until `event` is set or `within` seconds pass on `clock`; whether it was set.
    Cancelling the caller cancels both waits."""
    if event.is_set():
        return True
    waiting = asyncio.ensure_future(event.wait())
    timer = asyncio.ensure_future(clock.sleep(within))
    try:
        await asyncio.wait({waiting, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
        timer.cancel()
    return waiting.done() and not waiting.cancelled()


async def wait_for_future(future: asyncio.Future[Any], *, within: float, clock: Clock) -> bool:
    """Wait until `future` is done or `within` seconds pass on `clock`; whether it is
    done. The future itself is left as it is (a timeout does not cancel it)."""
    if future.done():
        return True
    timer = asyncio.ensure_future(clock.sleep(within))
    try:
        await asyncio.wait({future, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
    return future.done()
