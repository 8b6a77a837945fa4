"""Process wiring: the `kama` command and the one function per process that builds
its clients (Kubernetes, Temporal, HTTP) and starts it. The only layer that knows
every other one; nothing imports it except development tooling."""
