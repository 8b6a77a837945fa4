"""`kama runtime` starts every serving pod, so what it imports before it starts
llama-server is paid on every scale-out and every wake: the command line and the
supervisor must not pull in the Temporal SDK, the Kubernetes client, pydantic's
models of the API or the gateway."""

from __future__ import annotations

import subprocess
import sys

from kamadev.binaries import REPO_ROOT

HEAVY = ("temporalio", "kubernetes", "fastapi", "httpx", "kama.api", "gateway")


def test_the_serving_pod_supervisor_starts_without_heavy_imports() -> None:
    """`kama runtime` as a pod runs it, up to reading its serving plan (an empty one
    here, so it stops there): what it imported by then."""
    probe = "\n".join(
        [
            "import os, sys",
            "os.environ['KAMA_SERVING_PLAN'] = '{}'",
            "from kamactl.cli import main",
            "try:",
            "    main(['runtime'])",
            "except TypeError:",  # the empty plan
            "    pass",
            "top = {m.split('.')[0] if not m.startswith('kama.') else m for m in sys.modules}",
            f"print(sorted(top & set({HEAVY!r})))",
        ]
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert found == "[]", f"kama runtime imports {found} before starting llama-server"
