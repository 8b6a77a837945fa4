"""kama.offload_check reads llama-server's load log the way the pinned llama.cpp writes
it. The CPU lines were captured from build-llama.sh's llama-server (11434.0.0) started
with `--n-gpu-layers 99 -lv 4`; the CUDA lines are its format strings
(src/llama-model.cpp load_tensors, ggml/src/ggml-cuda/ggml-cuda.cu ggml_cuda_init)
with the same log prefix."""

from __future__ import annotations

import pytest

from kama.offload_check import check_offload

# captured: a CPU-only build asked for GPU layers (stderr, -lv 4)
CPU_BUILD = """\
warning: no usable GPU found, --gpu-layers option will be ignored
warning: one possible reason is that llama.cpp was compiled without GPU support
warning: consult docs/build.md for compilation instructions
0.00.002.877 I srv  llama_server: initializing ...
0.00.006.839 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
0.00.007.023 I load_tensors:   CPU_Mapped model buffer size =     0.49 MiB
0.00.011.272 I srv  llama_server: model loaded
""".splitlines()

# a CUDA build on one GPU, whole model offloaded (24 layers + the output layer)
CUDA_FULL = """\
0.00.000.412 I ggml_cuda_init: found 1 CUDA devices (Total VRAM: 143156 MiB):
0.00.000.413 I   Device 0: NVIDIA H200, compute capability 9.0, VMM: yes, VRAM: 143156 MiB
0.00.006.839 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
0.00.007.001 I load_tensors: offloading output layer to GPU
0.00.007.001 I load_tensors: offloading 24 repeating layers to GPU
0.00.007.002 I load_tensors: offloaded 25/25 layers to GPU
0.00.007.023 I load_tensors:        CUDA0 model buffer size =   910.50 MiB
0.00.007.024 I load_tensors:   CPU_Mapped model buffer size =    62.50 MiB
""".splitlines()


def test_cpu_build_offloads_nothing() -> None:
    check = check_offload(CPU_BUILD, n_gpu_layers=24)
    assert (check.offloaded, check.planned, check.ok, check.known) == (0, 24, False, True)
    assert check.reason == (
        "llama-server offloaded 0 of 24 planned GPU layers (no usable GPU found)"
    )
    assert dict(check.model_buffers_mib) == {"CPU_Mapped": 0.49}


def test_full_offload_matches_the_plan() -> None:
    check = check_offload(CUDA_FULL, n_gpu_layers=25)
    assert (check.offloaded, check.offloadable, check.ok) == (25, 25, True)
    assert check.cuda_devices == 1
    assert dict(check.model_buffers_mib) == {"CUDA0": 910.5, "CPU_Mapped": 62.5}
    assert check.reason == "llama-server offloaded 25 of 25 planned GPU layers"


def test_a_plan_beyond_the_model_is_capped_at_its_layers() -> None:
    check = check_offload(CUDA_FULL, n_gpu_layers=99)
    assert (check.expected, check.ok) == (25, True)


def test_fewer_layers_than_planned_is_short() -> None:
    lines = ["0.00.007.002 I load_tensors: offloaded 10/25 layers to GPU"]
    check = check_offload(lines, n_gpu_layers=25)
    assert not check.ok
    assert check.reason == "llama-server offloaded 10 of 25 planned GPU layers"


def test_cuda_that_fails_to_start_names_the_error() -> None:
    lines = [
        "ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected",
        "warning: no usable GPU found, --gpu-layers option will be ignored",
    ]
    check = check_offload(lines, n_gpu_layers=25)
    assert (check.offloaded, check.ok) == (0, False)
    assert check.reason == (
        "llama-server offloaded 0 of 25 planned GPU layers (failed to initialize CUDA: "
        "no CUDA-capable device is detected; no usable GPU found)"
    )


def test_default_verbosity_tells_nothing_for_a_cuda_build() -> None:
    default = [line for line in CUDA_FULL if "load_tensors: offload" not in line]
    check = check_offload(default, n_gpu_layers=25)
    assert (check.known, check.ok) == (False, False)
    assert "only at -lv 4" in check.reason


def test_a_cpu_plan_is_always_as_planned() -> None:
    assert check_offload(CPU_BUILD, n_gpu_layers=0).ok
    assert check_offload([], n_gpu_layers=0).ok


def test_negative_layers_are_refused() -> None:
    with pytest.raises(ValueError, match="n_gpu_layers"):
        check_offload([], n_gpu_layers=-1)
