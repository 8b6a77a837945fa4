"""Benchmarks reuse the workflow tests' Temporal dev server fixture."""

from tests.workflows.conftest import temporal_server

__all__ = ["temporal_server"]
