"""The prefix-affinity benchmark's capacity reading (tests/bench/capacity.py): where
a strategy's p90 TTFT crosses the limit, not the highest swept load under it."""

from __future__ import annotations

import pytest

from tests.bench.capacity import LoadPoint, capacity_at_limit, capacity_within_limit

# the 2026-12-05 run's PrefixAffinity sweep (2, 4, 6, 8, 16 users): 6 users missed
# the 3,174.0 ms limit by 0.4 ms
AFFINITY = [
    LoadPoint(0.221, 1708.3),
    LoadPoint(0.515, 2037.2),
    LoadPoint(0.746, 3174.4),
    LoadPoint(0.956, 4232.1),
    LoadPoint(0.795, 14676.5),
]


def test_a_near_miss_reads_as_the_rate_at_the_limit_not_the_load_before() -> None:
    assert capacity_within_limit(AFFINITY, limit_ms=3174.0) == 0.515
    assert capacity_at_limit(AFFINITY, limit_ms=3174.0) == pytest.approx(0.7459, abs=1e-4)


def test_the_crossing_is_interpolated_between_the_loads_around_it() -> None:
    points = [LoadPoint(1.0, 100.0), LoadPoint(2.0, 300.0)]
    assert capacity_at_limit(points, limit_ms=200.0) == pytest.approx(1.5)


def test_only_the_first_crossing_counts() -> None:
    """A later load back under the limit (noise, an overloaded sweep) does not raise it."""
    points = [LoadPoint(1.0, 100.0), LoadPoint(2.0, 300.0), LoadPoint(3.0, 150.0)]
    assert capacity_at_limit(points, limit_ms=200.0) == pytest.approx(1.5)
    assert capacity_within_limit(points, limit_ms=200.0) == 3.0


def test_a_sweep_that_never_reaches_the_limit_reads_its_highest_load() -> None:
    points = [LoadPoint(1.0, 100.0), LoadPoint(2.0, 150.0)]
    assert capacity_at_limit(points, limit_ms=200.0) == 2.0


def test_a_sweep_beyond_the_limit_from_its_first_load_has_no_capacity() -> None:
    points = [LoadPoint(1.0, 250.0), LoadPoint(2.0, 300.0)]
    assert capacity_at_limit(points, limit_ms=200.0) == 0.0
    assert capacity_within_limit(points, limit_ms=200.0) == 0.0


def test_errors_end_the_capacity_at_the_load_before_them() -> None:
    points = [LoadPoint(1.0, 100.0), LoadPoint(2.0, 150.0, errors=3), LoadPoint(3.0, 180.0)]
    assert capacity_at_limit(points, limit_ms=200.0) == 1.0


def test_a_load_that_serves_less_past_the_limit_does_not_lower_the_reading() -> None:
    """Overload: more users, fewer requests/s; the capacity is at least what the load
    within the limit served."""
    points = [LoadPoint(1.0, 100.0), LoadPoint(0.8, 300.0)]
    assert capacity_at_limit(points, limit_ms=200.0) == 1.0
