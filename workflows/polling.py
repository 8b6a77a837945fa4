"""How often a workflow asks again while it waits on something outside it (a busy
pod, a pod stuck terminating, a deployment that still uses an artifact): at its first
pace for a while, then doubling up to a ceiling. Every question is a few history
events, so a wait of hours asks a few thousand times at most, not one every second;
with continue-as-new at `workflows.entity.HISTORY_LIMIT` no run's history grows with
the wait."""

from __future__ import annotations

from datetime import timedelta

MAX_DOUBLINGS = 16


def poll_interval(
    *, polls: int, first: timedelta, maximum: timedelta, at_first_pace: int = 0
) -> timedelta:
    """The pause after the `polls`-th question (counting from 1)."""
    if polls <= at_first_pace:
        return first
    doublings = min(polls - at_first_pace, MAX_DOUBLINGS)
    return min(first * (1 << doublings), maximum)
