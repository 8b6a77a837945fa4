"""Go-style durations (`90s`, `10m`, `1h30m`) as written in Kama's specs, parsed
without I/O so workflows can turn `scaling.idleTimeout` and friends into timers."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

_PART: Final = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> timedelta:
    """`1h30m` → 5400 s. ValueError names the text when it is not a duration."""
    position, seconds = 0, 0.0
    for part in _PART.finditer(text):
        if part.start() != position:
            break
        seconds += float(part[1]) * _UNIT_SECONDS[part[2]]
        position = part.end()
    if not text or position != len(text):
        raise ValueError(f"not a duration (like 90s, 10m, 1h30m): {text!r}")
    return timedelta(seconds=seconds)
