"""A pydantic ValidationError as one line a condition or an error message can carry:
`<prefix><field path>: <why>` for the first few problems, then how many more. Shared by
the entity workflows (a stored spec that no longer validates) and planning (an
artifact status that does not: forged, or written by something that is not Kama)."""

from __future__ import annotations

from pydantic import ValidationError

PROBLEMS_SHOWN = 4


def describe_problems(error: ValidationError, *, prefix: str, shown: int = PROBLEMS_SHOWN) -> str:
    problems = [
        prefix + ".".join(str(part) for part in found["loc"]) + ": " + found["msg"]
        for found in error.errors()[:shown]
    ]
    more = error.error_count() - len(problems)
    return "; ".join(problems) + (f"; and {more} more" if more > 0 else "")
