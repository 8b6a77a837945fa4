"""Temporal workflows, one per module, deterministic and free of I/O."""
