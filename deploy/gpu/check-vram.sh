#!/usr/bin/env bash
# Kama's VRAM estimate against a real CUDA llama-server, on a machine with an NVIDIA GPU
# and nothing else reachable (deploy/gpu/README.md):
#
#   deploy/gpu/check-vram.sh [--llama-server DIR|FILE] [--out DIR] [--gpu N] [MODEL.gguf ...]
#
# Three generated models (about 90 MB, 1.7 GB, 4.4 GB, F16) or the given files, each at
# three context sizes (2048, 8192, 32768; KAMA_VRAM_CONTEXTS="a,b,c" to change), with
# the flags Kama renders for a GPU deployment; prints model, context, Kama's estimate,
# the measured peak, their ratio, and writes vram_check.json and vram_check.md to --out
# (default bench-results/). Exit 1 if any measured value exceeds its estimate, 2 if a
# row could not be measured (no fit, no start, not every layer on the GPU).
#
# The llama-server: --llama-server, else KAMA_LLAMA_CUDA_BIN, else
# deploy/local/build-llama-cuda.sh's cached build (built if missing: that needs its
# wheels and the sdist already in ~/.cache/kama, or PyPI, and a long compile).
# Needs nvidia-smi and the project's virtualenv (.venv, `make deps`).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${KAMA_PYTHON:-$REPO/.venv/bin/python}"
server="${KAMA_LLAMA_CUDA_BIN:-}"
args=()
while (($#)); do
  case "$1" in
    --llama-server) server="$2"; shift 2 ;;
    --out | --gpu | --models-dir) args+=("$1" "$2"); shift 2 ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

die() { printf 'check-vram: %s\n' "$*" >&2; exit 2; }
command -v nvidia-smi >/dev/null || die "no nvidia-smi: this needs a machine with an NVIDIA GPU and its driver"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader >&2 \
  || die "nvidia-smi cannot read the GPUs"
[[ -x "$PYTHON" ]] || die "no $PYTHON: run \`make deps\` (or set KAMA_PYTHON)"
if [[ -z "$server" ]]; then
  server="$(bash "$REPO/deploy/local/build-llama-cuda.sh")"
fi
[[ -d "$server" ]] && server="$server/llama-server"
[[ -x "$server" ]] || die "no llama-server at $server"
# a CUDA build links the driver's libcuda.so.1: a missing one means no driver here, and a
# binary that does not link it is a CPU build (which would only ever offload 0 layers)
missing="$(ldd "$server" | sed -n 's/^[[:space:]]*\([^ ]*\) => not found.*/\1/p' | xargs)"
[[ -z "$missing" ]] || die "$server cannot load $missing"
ldd "$server" | grep -q 'libcuda\.so\.1' || die "$server is not a CUDA build (it does not link libcuda.so.1)"

cd "$REPO"
exec timeout "${KAMA_VRAM_TIMEOUT_S:-540}" "$PYTHON" -m kamadev.vram_check --llama-server "$server" \
  --contexts "${KAMA_VRAM_CONTEXTS:-2048,8192,32768}" "${args[@]}"
