"""The ports of a serving pod, in a module of their own that imports nothing: a
starting `kama runtime` binds its probe port before it imports anything heavier
(runtime/probe_socket.py)."""

from __future__ import annotations

LLAMA_PORT = 8080
"""llama-server's, inside the pod."""
SUPERVISOR_PORT = 8081
"""The runtime supervisor's: readiness, liveness and the metrics relay."""
