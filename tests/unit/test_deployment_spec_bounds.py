"""Specs the schema used to accept and that then jammed the DeploymentWorkflow:
`concurrency > 1` without `contextSize` (a ValueError inside workflow code) and
durations that overflow (`999999999999h`). Both are now refused by the pydantic
model with the same message the CRD's CEL rules give `kubectl apply`."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kama.api.deployment import ModelDeploymentSpec
from kama.durations import parse_duration


def spec(**fields: Any) -> dict[str, Any]:
    return {"modelRef": {"name": "tiny"}, **fields}


def test_concurrency_above_one_needs_a_context_size() -> None:
    with pytest.raises(ValidationError, match=r"spec\.runtime\.contextSize"):
        ModelDeploymentSpec.model_validate(spec(runtime={"concurrency": 4}))
    ok = ModelDeploymentSpec.model_validate(spec(runtime={"concurrency": 4, "contextSize": 512}))
    assert ok.runtime.concurrency == 4
    assert ModelDeploymentSpec.model_validate(spec(runtime={})).runtime.context_size is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("idleTimeout", "999999999999h"),
        ("idleTimeout", "721h"),
        ("coldStartTimeout", "2h"),
        ("drainTimeout", "25h"),
        ("idleTimeout", "0s"),
    ],
)
def test_durations_are_bounded(field: str, value: str) -> None:
    with pytest.raises(ValidationError, match=rf"scaling\.{field}"):
        ModelDeploymentSpec.model_validate(spec(scaling={field: value}))


def test_durations_within_bounds_parse() -> None:
    scaling = ModelDeploymentSpec.model_validate(
        spec(scaling={"idleTimeout": "720h", "coldStartTimeout": "1h", "drainTimeout": "90s"})
    ).scaling
    assert parse_duration(scaling.idle_timeout).total_seconds() == 720 * 3600


def test_an_overflowing_duration_is_a_value_error_not_an_overflow() -> None:
    with pytest.raises(ValueError, match="too long"):
        parse_duration("999999999999h")
