"""`python -m kamactl` is the `kama` command (the local stack starts Kama's processes
this way, with the interpreter of the environment it runs in)."""

from kamactl.cli import run

run()
