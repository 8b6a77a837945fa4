"""The slowest tests of a run, from the JUnit XML that `make test` writes: the table the
README's test-time section shows, so the numbers there come from a run, not memory.

`python -m kamadev.slowest_tests test-results/junit.xml [N]` prints a Markdown table
of the N (default 20) slowest tests with their seconds, then the time of each lane
(`kamadev.suite_lanes`) and the total. The suite runs on several pytest-xdist workers,
so the times are summed over workers and the run's wall-clock time is printed beside
them."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from kamadev.suite_lanes import LANE_NAMES, lane_name, suite_lane


@dataclass(frozen=True)
class CaseTime:
    name: str  # path::test as pytest names it
    seconds: float


def case_times(xml: str) -> list[CaseTime]:
    """Every test case in a JUnit XML report, slowest first."""
    root = ET.fromstring(xml)
    times = []
    for case in root.iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        times.append(CaseTime(f"{module}.py::{case.get('name', '')}", float(case.get("time", 0))))
    return sorted(times, key=lambda t: -t.seconds)


def wall_seconds(xml: str) -> float | None:
    """The run's own duration (the testsuite's `time`), or None if it is absent."""
    suite = ET.fromstring(xml).find(".//testsuite")
    time = suite.get("time") if suite is not None else None
    return float(time) if time else None


def lane_of(case: CaseTime) -> str:
    path = case.name.split("::", 1)[0]
    return lane_name(suite_lane(path=path, module=Path(path).stem))


def table(times: list[CaseTime], *, top: int = 20, wall_s: float | None = None) -> str:
    total = sum(t.seconds for t in times)
    lines = ["| # | test | s |", "|---|---|---:|"]
    lines += [f"| {i} | `{t.name}` | {t.seconds:.1f} |" for i, t in enumerate(times[:top], 1)]
    lanes: dict[str, list[CaseTime]] = {name: [] for name in LANE_NAMES}
    for case in times:
        lanes[lane_of(case)].append(case)
    lines += ["", "| lane | tests | min (summed over workers) |", "|---|---:|---:|"]
    lines += [
        f"| {name} | {len(cases)} | {sum(c.seconds for c in cases) / 60:.1f} |"
        for name, cases in lanes.items()
    ]
    wall = f", {wall_s / 60:.1f} min wall-clock" if wall_s is not None else ""
    lines.append(f"\n{len(times)} tests, {total / 60:.1f} min in tests{wall}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m kamadev.slowest_tests <junit.xml> [N]", file=sys.stderr)
        return 2
    top = int(argv[1]) if len(argv) > 1 else 20
    xml = Path(argv[0]).read_text()
    print(table(case_times(xml), top=top, wall_s=wall_seconds(xml)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
