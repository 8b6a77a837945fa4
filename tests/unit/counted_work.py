"""Work counted rather than timed, for tests that would otherwise say "it ran in under
a second" (issue #40, item 2): `counted` runs a function under cProfile and gives back
how many calls it made, Python functions and builtins alike; `CountingStream` counts
the reads of a byte stream and the bytes they returned. Both come out the same on a
machine busy with other builds as on an idle one, so a bound on them fails only when
the code does more work per input. How fast that work runs is measured in
tests/bench/ (bench_gguf_parse.py for the GGUF parser)."""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable
from typing import TypeVar

from kama.gguf.reader import ByteStream

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)


def counted(run: Callable[[], T]) -> tuple[T, int]:
    """`run()`'s result and the number of function calls it made; an exception it
    raises propagates, so use `calls_until_raised` for a call that must fail."""
    profile = cProfile.Profile()
    result = profile.runcall(run)
    return result, pstats.Stats(profile).total_calls  # type: ignore[attr-defined]


def calls_until_raised(run: Callable[[], object], error: type[E]) -> tuple[E, int]:
    """The `error` that `run()` raised and the number of function calls it made until
    then (another exception propagates; no exception fails)."""
    profile = cProfile.Profile()
    try:
        profile.runcall(run)
    except error as raised:
        calls: int = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
        return raised, calls
    raise AssertionError(f"{run!r} did not raise {error.__name__}")


class CountingStream:
    """A `ByteStream` over another that counts its `read` calls and bytes."""

    def __init__(self, stream: ByteStream) -> None:
        self._stream = stream
        self.reads = 0
        self.bytes_read = 0

    def read(self, n: int, /) -> bytes:
        data = self._stream.read(n)
        self.reads += 1
        self.bytes_read += len(data)
        return data
