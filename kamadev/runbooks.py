"""The shell steps of Kama's runbooks (docs/runbooks/*.md), so a stack test can run them
against the situation each describes and a runbook cannot rot.

A runbook's executable steps are fenced ``bash <situation>`` blocks: the info string
names the situation they handle (``bash corrupted-cache``). Blocks run in order, each
with ``bash -euo pipefail``, with ``NS`` and ``NAME`` (the resource's namespace and
name), ``KUBECONFIG`` and ``TEMPORAL_ADDRESS`` set as an operator's shell has them.
Plain ``bash`` blocks (no situation) are not allowed: every command shown is tested.
Pure: no I/O."""

from __future__ import annotations

import re
from collections import defaultdict

_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)


def runbook_steps(text: str) -> dict[str, list[str]]:
    """The shell blocks of a runbook by situation, in document order. A `bash` block
    without a situation is an error (it would be shown but never run)."""
    steps: dict[str, list[str]] = defaultdict(list)
    for info, body in _FENCE.findall(text):
        words = info.split()
        if not words or words[0] not in ("bash", "sh", "shell"):
            continue
        if len(words) != 2:
            raise ValueError(
                f"a shell block must name one situation (```bash <situation>): {info!r}"
            )
        steps[words[1]].append(body)
    return dict(steps)
