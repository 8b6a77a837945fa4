"""Where the stack's binaries come from: built once by the scripts in deploy/local.

The scripts cache their output under ~/.cache/kama; this module runs them (they
return at once when the cache is warm) and hands back the binary directories.
Helm, KEDA and Kama's images are looked up on demand (`ensure_helm`, `ensure_keda`,
`build_images`): only the chart's tests, the KEDA tests and `make images` need them.
"""

from __future__ import annotations

import os
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


def ensure_helm() -> Path:
    """The helm binary built from helm.sh/helm/v4 (deploy/local/build-helm.sh)."""
    return _run_build("build-helm.sh") / "helm"


@dataclass(frozen=True)
class KedaBinaries:
    """deploy/local/build-keda.sh's output: KEDA's operator (`keda`) and metrics adapter
    (`keda-adapter`) in `bin`, and the CRDs of the same module version
    (config/crd/bases) in `crds`."""

    bin: Path

    @property
    def operator(self) -> Path:
        return self.bin / "keda"

    @property
    def adapter(self) -> Path:
        return self.bin / "keda-adapter"

    @property
    def crds(self) -> Path:
        return self.bin.parent / "crds"


def ensure_keda() -> KedaBinaries:
    """KEDA built from github.com/kedacore/keda/v2 (kamadev.keda runs it on the stack)."""
    return KedaBinaries(bin=_run_build("build-keda.sh"))


@dataclass(frozen=True)
class NodeBinaries:
    """deploy/local/build-node.sh's output: kubelet, containerd, CNI plugins, ... in
    `bin`, and the pause and CoreDNS images as OCI archives in `images`."""

    bin: Path

    @property
    def images(self) -> Path:
        return self.bin.parent / "images"


def ensure_node_binaries() -> NodeBinaries:
    return NodeBinaries(bin=_run_build("build-node.sh"))


@dataclass(frozen=True)
class BuiltImage:
    """One image from deploy/images/build.sh: an OCI layout and its oci-archive."""

    name: str
    digest: str  # of the manifest: what `image@sha256:...` names
    layout: Path

    @property
    def archive(self) -> Path:
        return self.layout.with_name(self.layout.name + ".tar")


def build_images(
    *, cache: Path | None = None, source: Path | None = None, timeout: float = 1200
) -> dict[str, BuiltImage]:
    """Build (or find cached) Kama's images; `cache` replaces ~/.cache/kama/images,
    `source` this checkout (a copy with pyproject.toml, uv.lock, README.md and the packages)."""
    env = dict(os.environ)
    if cache is not None:
        env["KAMA_IMAGES_CACHE"] = str(cache)
    if source is not None:
        env["KAMA_IMAGES_SOURCE"] = str(source)
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "deploy" / "images" / "build.sh")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"deploy/images/build.sh failed with exit code {result.returncode}")
    images = {}
    for line in result.stdout.splitlines():
        name, digest, layout = line.split()
        images[name] = BuiltImage(name=name, digest=digest, layout=Path(layout))
    return images
