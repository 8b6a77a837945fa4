"""What `kama status` prints: one row per Kama resource with what its workflow says it
is doing, as a table for a person or JSON for a script. Pure: the rows are built from
the resource as the API server returned it and the workflow's `status` answer (or
why there is none); `kamactl.status_cmd` fetches both.

A row's SINCE is the latest `lastTransitionTime` of the resource's conditions: when
it last changed state, which says more than when its workflow's current run began
(an entity workflow continues as new every couple of thousand events)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from kama.api.meta import WORKFLOW_ID_FIELD

DOING_WIDTH: Final = 72
"""Characters of DOING in the table (JSON has all of it)."""

HEADER: Final = ("KIND", "RESOURCE", "READY", "WORKFLOW", "DOING", "SINCE")


@dataclass(frozen=True)
class ResourceStatus:
    """One resource and what its workflow answered."""

    kind: str
    namespace: str
    name: str
    workflow_id: str
    state: str  # Running, Completed, ... as Temporal says; NotFound; Unknown
    doing: str | None = None  # the `status` query's `doing`
    last_error: str | None = None
    generation: int | None = None  # the generation the workflow works on
    observed_generation: int | None = None  # the resource's, as its status says
    ready: str | None = None  # the Ready condition's status
    since: datetime | None = None
    note: str | None = None  # why there is no answer (not found, query timed out)
    answer: Mapping[str, Any] = field(default_factory=dict)  # the whole `status` answer

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "workflowID": self.workflow_id,
            "state": self.state,
            "doing": self.doing,
            "lastError": self.last_error,
            "generation": self.generation,
            "observedGeneration": self.observed_generation,
            "ready": self.ready,
            "since": self.since.isoformat() if self.since else None,
            "note": self.note,
            "status": dict(self.answer),
        }


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def conditions_of(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = obj.get("status") or {}
    return [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]


def last_transition(obj: Mapping[str, Any]) -> datetime | None:
    """When the resource last changed state: its latest condition transition."""
    times = [t for c in conditions_of(obj) if (t := _parse_time(c.get("lastTransitionTime")))]
    return max(times, default=None)


def ready_of(obj: Mapping[str, Any]) -> str | None:
    return next(
        (str(c.get("status")) for c in conditions_of(obj) if c.get("type") == "Ready"), None
    )


def written_workflow_id(obj: Mapping[str, Any]) -> str | None:
    """The workflow the resource's status names (`status.workflowID`), if any."""
    value = (obj.get("status") or {}).get(WORKFLOW_ID_FIELD)
    return value if isinstance(value, str) and value else None


def row_for(
    *,
    kind: str,
    obj: Mapping[str, Any],
    workflow_id: str,
    state: str,
    answer: Mapping[str, Any] | None,
    note: str | None = None,
) -> ResourceStatus:
    """A row from the resource and its workflow's `status` answer (None: no answer)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    answer = answer or {}
    generation = answer.get("generation")
    observed = status.get("observedGeneration")
    return ResourceStatus(
        kind=kind,
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        workflow_id=workflow_id,
        state=state,
        doing=answer.get("doing"),
        last_error=answer.get("last_error"),
        generation=generation if isinstance(generation, int) else None,
        observed_generation=observed if isinstance(observed, int) else None,
        ready=ready_of(obj),
        since=last_transition(obj),
        note=note,
        answer=answer,
    )


def age(since: datetime | None, *, now: datetime) -> str:
    """kubectl's way of saying how long ago: 45s, 12m, 3h20m, 5d."""
    if since is None:
        return "-"
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 120:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    return f"{hours // 24}d"


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())  # one line
    return text if len(text) <= width else text[: width - 1] + "…"


def doing_cell(row: ResourceStatus) -> str:
    """What the table says the workflow is doing: its answer, else why there is none."""
    if row.doing:
        text = row.doing
        if row.last_error and row.last_error not in text:
            text = f"{text} (last error: {row.last_error})"
        return text
    return row.note or "-"


def render_table(rows: Sequence[ResourceStatus], *, now: datetime) -> str:
    """Aligned columns, like `kubectl get`; "No Kama resources found." when empty."""
    if not rows:
        return "No Kama resources found."
    cells = [HEADER] + [
        (
            row.kind,
            f"{row.namespace}/{row.name}",
            row.ready or "-",
            row.state,
            _shorten(doing_cell(row), DOING_WIDTH),
            age(row.since, now=now),
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADER))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    )


def render_json(rows: Sequence[ResourceStatus]) -> str:
    return json.dumps({"items": [row.to_json() for row in rows]}, indent=2)
