"""Standard status conditions (metav1.Condition shape), and the status they sit in,
computed without I/O.

A condition keeps its lastTransitionTime while its status does not change, so
`kubectl describe` shows when something became true, not when it was last checked.
Every entity workflow builds the status it writes with `updated_status` (a dict) or
`updated_status_model` (a pydantic status model, serialised once by `status_json`
for the patch), so each write also records the generation it is about
(`observedGeneration`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, Self, TypeVar

from pydantic import BaseModel

from kama.api.meta import Condition, ConditionStatus

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


class ConditionedStatus(Protocol):
    """A status model with conditions (`ModelArtifactStatus`, `ModelCacheStatus`)."""

    observed_generation: int | None
    conditions: list[Condition]

    @property
    def model_fields_set(self) -> set[str]: ...

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> Self: ...


StatusModel = TypeVar("StatusModel", bound=ConditionedStatus)


def whole_seconds(moment: datetime) -> datetime:
    """`moment` as the API keeps times (RFC 3339 to the second, as `rfc3339` writes)."""
    return moment.replace(microsecond=0)


def set_condition_models(
    conditions: Sequence[Condition],
    updates: list[ConditionUpdate],
    *,
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    """`set_conditions` on typed conditions: each of `updates` set in order, a
    condition keeping its lastTransitionTime while its status does not change; sorted
    by type."""
    found = {c.type: c for c in conditions}
    for kind, value, reason, message in updates:
        status = (
            ConditionStatus.UNKNOWN
            if value is None
            else (ConditionStatus.TRUE if value else ConditionStatus.FALSE)
        )
        previous = found.get(str(kind))
        found[str(kind)] = Condition(
            type=str(kind),
            status=status,
            reason=str(reason),
            message=message[:32768],
            last_transition_time=previous.last_transition_time
            if previous is not None and previous.status == status
            else whole_seconds(now),
            observed_generation=generation,
        )
    return [found[kind] for kind in sorted(found)]


def updated_status_model(
    status: StatusModel,
    updates: list[ConditionUpdate],
    *,
    fields: Sequence[StatusModel] = (),
    now: datetime,
    generation: int,
) -> StatusModel:
    """`updated_status` on a status model: `status` with every field set in each of
    `fields` (partial statuses of the same model, applied in order), `updates` applied
    to its conditions, and `observedGeneration` set to the generation these decisions
    were made for."""
    changed = {name: getattr(part, name) for part in fields for name in part.model_fields_set}
    conditions = set_condition_models(status.conditions, updates, now=now, generation=generation)
    return status.model_copy(
        update={**changed, "observed_generation": generation, "conditions": conditions}
    )


def status_json(status: BaseModel) -> dict[str, Any]:
    """A status model as its resource's status patch: camelCase, only the fields that
    were set, none that are null."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)


def condition_status(conditions: Conditions, type: str) -> str | None:
    found = next((c for c in conditions if c.get("type") == type), None)
    return None if found is None else str(found.get("status"))
