"""Standard status conditions (metav1.Condition shape), and the status they sit in,
computed without I/O.

A condition keeps its lastTransitionTime while its status does not change, so
`kubectl describe` shows when something became true, not when it was last checked.
Every entity workflow builds the status it writes with `updated_status`, so each
write also records the generation it is about (`observedGeneration`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

Conditions = list[dict[str, Any]]


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: Conditions,
    *,
    type: str,
    status: bool | None,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> Conditions:
    """A new list with `type` set; other conditions are kept as they are."""
    value = "Unknown" if status is None else ("True" if status else "False")
    previous = next((c for c in conditions if c.get("type") == type), None)
    transition = rfc3339(now)
    if previous is not None and previous.get("status") == value:
        transition = previous.get("lastTransitionTime", transition)
    entry: dict[str, Any] = {
        "type": type,
        "status": value,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": transition,
    }
    if generation is not None:
        entry["observedGeneration"] = generation
    others = [c for c in conditions if c.get("type") != type]
    return sorted([*others, entry], key=lambda c: str(c["type"]))


ConditionUpdate = tuple[str, bool | None, str, str]
"""(type, status, reason, message) as a workflow decides it."""


def set_conditions(
    conditions: Conditions,
    updates: list[ConditionUpdate],
    *,
    now: datetime,
    generation: int | None,
) -> Conditions:
    """`set_condition` for each of `updates`, in order."""
    for kind, value, reason, message in updates:
        conditions = set_condition(
            conditions,
            type=str(kind),
            status=value,
            reason=reason,
            message=message,
            now=now,
            generation=generation,
        )
    return conditions


def updated_status(
    status: Mapping[str, Any],
    updates: list[ConditionUpdate],
    *,
    fields: Mapping[str, Any],
    now: datetime,
    generation: int,
) -> dict[str, Any]:
    """`status` with `fields` set, `updates` applied to its conditions, and
    `observedGeneration` set to the generation these decisions were made for."""
    conditions = set_conditions(
        list(status.get("conditions", [])), updates, now=now, generation=generation
    )
    return {**status, **fields, "observedGeneration": generation, "conditions": conditions}


def condition_status(conditions: Conditions, type: str) -> str | None:
    found = next((c for c in conditions if c.get("type") == type), None)
    return None if found is None else str(found.get("status"))
