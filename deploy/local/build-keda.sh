#!/usr/bin/env bash
# Builds KEDA's operator and metrics adapter from the published Go module
# (github.com/kedacore/keda/v2) into ~/.cache/kama/keda/<version>/bin, and copies the
# module's CRDs (config/crd/bases) into ~/.cache/kama/keda/<version>/crds, for the
# stack tests of KEDA mode (kamadev/keda.py). No release download is reachable where
# Kama is developed, but the Go module proxy is. KEDA's go.mod carries a replace
# directive, so `go install pkg@version` refuses it: the module's own source (with
# its go.mod and go.sum, every dependency pinned) is built in a scratch copy.
# The first build compiles every scaler's SDK (AWS, Azure, GCP, ...): it is the
# slowest part of a fresh `make setup`; later runs skip it. Prints the bin directory.
set -euo pipefail

KEDA_VERSION="${KAMA_KEDA_VERSION:-v2.21.0}"
CACHE_ROOT="${KAMA_CACHE_DIR:-$HOME/.cache/kama}"
OUT="$CACHE_ROOT/keda/$KEDA_VERSION"
BIN="$OUT/bin"
CRDS="$OUT/crds"

log() { printf '[build-keda %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

have_bins() { [[ -x "$BIN/keda" && -x "$BIN/keda-adapter" ]]; }
have_crds() { [[ -f "$CRDS/keda.sh_scaledobjects.yaml" ]]; }
have_all() { have_bins && have_crds; }

if have_all; then
  log "cached: $BIN"
  echo "$BIN"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "build-keda: Go is not installed (need go >= 1.26 on PATH to build KEDA $KEDA_VERSION from modules)" >&2
  exit 1
fi

mkdir -p "$BIN"
exec 9>"$OUT/.build.lock"
flock 9
if have_all; then echo "$BIN"; exit 0; fi

src_dir="$(cd "$OUT" && GOFLAGS=-mod=mod go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
if [[ -z "$src_dir" || ! -f "$src_dir/go.mod" ]]; then
  echo "build-keda: could not download github.com/kedacore/keda/v2@$KEDA_VERSION" >&2
  exit 1
fi

if ! have_crds; then
  # KEDA's own CRDs, unpatched (its kustomize patches only add validation bounds)
  crds_tmp="$(mktemp -d "$OUT/crds.XXXXXX")"
  cp "$src_dir"/config/crd/bases/*.yaml "$crds_tmp/"
  chmod u+w "$crds_tmp"/*.yaml
  rm -rf "$CRDS"
  mv "$crds_tmp" "$CRDS"
  log "CRDs: $CRDS"
fi

if ! have_bins; then
  log "building KEDA $KEDA_VERSION (operator + metrics adapter) from github.com/kedacore/keda/v2"
  tmp="$(mktemp -d "$OUT/src.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  cp -r "$src_dir/." "$tmp/"
  chmod -R u+w "$tmp"
  ldflags="-s -w -X github.com/kedacore/keda/v2/version.Version=${KEDA_VERSION#v}"
  ldflags+=" -X github.com/kedacore/keda/v2/version.GitCommit=module-proxy"
  (cd "$tmp" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" \
    -o "$tmp/out/keda" ./cmd/operator)
  log "operator built; building the metrics adapter"
  (cd "$tmp" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" \
    -o "$tmp/out/keda-adapter" ./cmd/adapter)
  mv "$tmp/out/keda" "$tmp/out/keda-adapter" "$BIN/"
  log "done: $BIN"
fi
echo "$BIN"
