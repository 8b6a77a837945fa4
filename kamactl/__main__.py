"""`python -m kamactl` is the `kama` command (the local stack starts Kama's processes
this way, with the interpreter of the environment it runs in)."""

import sys

from kamactl.cli import main

sys.exit(main())
