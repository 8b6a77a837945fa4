#!/usr/bin/env bash
# Writes llama.cpp's own random-weight GGUF of every architecture the pinned
# llama.cpp supports (dense and MoE), with its `tests/test-llama-archs.cpp` built from
# the same sdist as llama-server (deploy/local/build-llama.sh). The planner benchmark
# (tests/bench/bench_planner.py) measures llama-server on these: nobody here wrote
# them, so an estimator tuned on our own GGUF factory cannot pass by construction.
# Prints the directory of the models; cached in ~/.cache/kama/llama/<version>/archs.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$(bash "$REPO/deploy/local/build-llama.sh")"
OUT="$(dirname "$BIN")"
MODELS="$OUT/archs"
JOBS="${LLAMA_BUILD_JOBS:-2}"

log() { printf '[build-llama-archs %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

exec 9>"$OUT/.build.lock"
flock 9
if [[ -f "$MODELS/.complete" ]]; then
  log "cached: $MODELS"
  echo "$MODELS"
  exit 0
fi
if [[ ! -x "$BIN/test-llama-archs" ]]; then
  log "configuring the existing build with llama.cpp's tests (the libraries are reused)"
  cmake -S "$OUT/src/llama.cpp" -B "$OUT/build" -DLLAMA_BUILD_TESTS=ON >/dev/null
  log "building test-llama-archs with $JOBS jobs"
  cmake --build "$OUT/build" --target test-llama-archs -j "$JOBS" >/dev/null
  install -m 0755 "$(find "$OUT/build" -type f -name test-llama-archs -perm -u+x | head -1)" \
    "$BIN/test-llama-archs"
fi
rm -rf "$MODELS" && mkdir -p "$MODELS"
log "writing one model per architecture into $MODELS"
"$BIN/test-llama-archs" -o "$MODELS" -s 1 >"$MODELS/.log" 2>&1
touch "$MODELS/.complete"
log "done: $(find "$MODELS" -name '*.gguf' | wc -l) models"
echo "$MODELS"
