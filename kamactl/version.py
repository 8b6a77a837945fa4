"""`kama version`: what is running, for a bug report or an upgrade check: Kama's
package version, the git commit it was built from when the build embedded one, and
the Python and Temporal SDK versions it runs on.

The commit comes from `KAMA_GIT_COMMIT` (an image can set it in its config) or from
a `BUILD_COMMIT` file inside the `kamactl` package (a build writes it next to this
module before making the wheel); a checkout run from source has neither: `unknown`."""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from importlib import metadata, resources

COMMIT_FILE = "BUILD_COMMIT"


def _installed(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


def embedded_commit(*, env: Mapping[str, str]) -> str:
    """The commit Kama was built from, or `unknown`."""
    if commit := env.get("KAMA_GIT_COMMIT", "").strip():
        return commit
    try:
        text = resources.files("kamactl").joinpath(COMMIT_FILE).read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        return "unknown"
    return text.strip() or "unknown"


def version_info(*, env: Mapping[str, str]) -> dict[str, str]:
    return {
        "kama": _installed("kama"),
        "commit": embedded_commit(env=env),
        "python": platform.python_version(),
        "temporalio": _installed("temporalio"),
    }


def render_version(info: Mapping[str, str], *, output: str = "text") -> str:
    """`kama 0.1.0 (commit abc1234)` and one line per runtime; or the JSON object."""
    if output == "json":
        return json.dumps(dict(info), indent=2)
    return "\n".join(
        [
            f"kama {info['kama']} (commit {info['commit']})",
            f"python {info['python']}",
            f"temporalio {info['temporalio']}",
        ]
    )
