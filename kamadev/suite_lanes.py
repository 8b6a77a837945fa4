"""The lanes the test suite runs in, in order: pure and workflow tests, stack tests,
the modules that need KEDA (whose first build `make pytest` overlaps with the lanes
before), then the disruptive modules one by one (outages, node loss, stacks of their
own torn down). tests/conftest.py orders the collected tests by `suite_lane`, and
`kamadev.slowest_tests` sums a run's time per lane. Pure: no I/O."""

from __future__ import annotations

from typing import Final

KEDA_MODULES: Final = frozenset({"test_keda_mode", "test_keda_stack"})
"""Modules that need KEDA's binaries (deploy/local/build-keda.sh holds a lock: their
fixture waits for a build still running)."""
DISRUPTIVE_MODULES: Final = (
    "test_node_loss",
    "test_control_plane_outages",
    "test_temporal_outages",
    "test_teardown",
)
"""Modules that stop parts of the session stack or build and tear down stacks of their
own, in the order they run, last."""
LANE_NAMES: Final = ("pure", "stack", "KEDA", "disruptive")


def suite_lane(*, path: str, module: str) -> int:
    """The lane a test module runs in: 0 pure (tests/unit, tests/workflows), 1 stack,
    2 KEDA, 3 + i the i-th disruptive module. `path` uses forward slashes."""
    if module in DISRUPTIVE_MODULES:
        return 3 + DISRUPTIVE_MODULES.index(module)
    if module in KEDA_MODULES:
        return 2
    return 1 if "/integration/" in path else 0


def lane_name(lane: int) -> str:
    return LANE_NAMES[min(lane, len(LANE_NAMES) - 1)]
