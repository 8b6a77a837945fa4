"""The local stack: a real Kubernetes control plane, two real nodes, Temporal and
llama-server on one machine without Docker, for Kama's tests and `make dev`.

Only test and development tooling lives here; nothing in Kama's runtime imports it.
"""
