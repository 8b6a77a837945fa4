"""Go-style durations (`90s`, `10m`, `1h30m`) as written in Kama's specs, parsed
without I/O so workflows can turn `scaling.idleTimeout` and friends into timers."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

_PART: Final = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# Go's time.Duration (what the API server's CEL `duration()` parses) ends at ~292 years;
# nothing Kama times comes near, and timedelta overflows far later
LONGEST_SECONDS: Final = 100 * 365 * 24 * 3600


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
    if seconds > LONGEST_SECONDS:
        raise ValueError(f"duration too long (over 100 years): {text!r}")
    return timedelta(seconds=seconds)
