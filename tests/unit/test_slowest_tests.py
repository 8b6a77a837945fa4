"""The slowest-tests table reads pytest's JUnit XML: slowest first, named as pytest
names them, with the run's total."""

from __future__ import annotations

from kamadev.slowest_tests import case_times, table, wall_seconds

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" time="61.5">
<testcase classname="tests.unit.test_a" name="test_fast" time="0.5"/>
<testcase classname="tests.integration.test_b" name="test_slow[x]" time="92.25"/>
<testcase classname="tests.unit.test_a" name="test_mid" time="3"/>
</testsuite></testsuites>"""


def test_the_slowest_come_first_with_the_total() -> None:
    times = case_times(XML)
    assert [t.name for t in times] == [
        "tests/integration/test_b.py::test_slow[x]",
        "tests/unit/test_a.py::test_mid",
        "tests/unit/test_a.py::test_fast",
    ]
    shown = table(times, top=2)
    assert "| 1 | `tests/integration/test_b.py::test_slow[x]` | 92.2 |" in shown
    assert "test_fast" not in shown and "3 tests, 1.6 min in tests" in shown


def test_the_runs_wall_clock_is_shown_beside_the_summed_time() -> None:
    """With several workers the tests' times add up to more than the run took."""
    assert wall_seconds(XML) == 61.5
    shown = table(case_times(XML), wall_s=wall_seconds(XML))
    assert "3 tests, 1.6 min in tests, 1.0 min wall-clock" in shown
    assert wall_seconds(XML.replace(' time="61.5"', "")) is None


def test_each_lane_gets_its_time() -> None:
    xml = XML.replace(
        "</testsuite>",
        '<testcase classname="tests.integration.test_temporal_outages" name="test_o" time="60"/>'
        '<testcase classname="tests.integration.test_keda_mode" name="test_k" time="30"/>'
        "</testsuite>",
    )
    shown = table(case_times(xml))
    assert "| pure | 2 | 0.1 |" in shown
    assert "| stack | 1 | 1.5 |" in shown
    assert "| KEDA | 1 | 0.5 |" in shown
    assert "| disruptive | 1 | 1.0 |" in shown
