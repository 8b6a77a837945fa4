"""Where the stack's binaries come from: built once by the scripts in deploy/local.

The scripts cache their output under ~/.cache/kama; this module runs them (they
return at once when the cache is warm) and hands back the binary directories.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
_SCRIPTS = REPO_ROOT / "deploy" / "local"


@dataclass(frozen=True)
class Binaries:
    k8s_bin: Path
    llama_bin: Path
    kubectl: Path
    temporal: Path

    def k8s(self, name: str) -> Path:
        return self.k8s_bin / name

    @property
    def llama_server(self) -> Path:
        return self.llama_bin / "llama-server"

    @property
    def gguf_split(self) -> Path:
        return self.llama_bin / "llama-gguf-split"


def _run_build(script: str) -> Path:
    result = subprocess.run(
        ["bash", str(_SCRIPTS / script)], stdout=subprocess.PIPE, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{script} failed with exit code {result.returncode}")
    return Path(result.stdout.strip().splitlines()[-1])


def _venv_tool(name: str) -> Path:
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return candidate
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: run `uv sync` (it comes from a dev dependency)")
    return Path(found)


def ensure_binaries() -> Binaries:
    """Build (or find cached) control-plane and llama.cpp binaries."""
    return Binaries(
        k8s_bin=_run_build("build-k8s.sh"),
        llama_bin=_run_build("build-llama.sh"),
        kubectl=_venv_tool("kubectl"),
        temporal=_venv_tool("temporal"),
    )
