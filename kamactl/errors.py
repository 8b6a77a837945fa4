"""Errors the `kama` command turns into exit codes, in a module of their own so the
command line can catch them without importing the clients that raise them (the
Temporal SDK and the Kubernetes client: `kama runtime` needs neither)."""

from __future__ import annotations


class TemporalSetupError(Exception):
    """Temporal is reachable but not ready for Kama (the message says how to fix it):
    the process exits with EX_CONFIG instead of failing on its first workflow."""
