#!/usr/bin/env bash
# Builds Helm from its published Go module (helm.sh/helm/v4, or v3) into
# ~/.cache/kama/helm/<version>/bin/helm. No release download is reachable on the
# machines Kama is developed on, but the Go module proxy is, so the pinned release
# is compiled once (about 3 min on 2 cores) and reused afterwards (the build is
# skipped when the binary is present). Prints the bin directory.
set -euo pipefail

HELM_VERSION="${KAMA_HELM_VERSION:-v4.3.2}"
CACHE_ROOT="${KAMA_CACHE_DIR:-$HOME/.cache/kama}"
OUT="$CACHE_ROOT/helm/$HELM_VERSION"
BIN="$OUT/bin"

log() { printf '[build-helm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$BIN/helm" ]]; then
  log "cached: $BIN"
  echo "$BIN"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "build-helm: Go is not installed (need go >= 1.26 on PATH to build Helm $HELM_VERSION from modules)" >&2
  exit 1
fi

mkdir -p "$BIN"
# one build at a time per cache entry (tests, make dev and CI may all ask at once)
exec 9>"$OUT/.build.lock"
flock 9
if [[ -x "$BIN/helm" ]]; then echo "$BIN"; exit 0; fi

# the module path carries the major version (helm.sh/helm/v3 for `make matrix`'s Helm 3)
major="${HELM_VERSION#v}"
MODULE="helm.sh/helm/v${major%%.*}"
log "building helm $HELM_VERSION from $MODULE (first build takes a few minutes on 2 cores)"
ldflags="-s -w -X $MODULE/internal/version.version=$HELM_VERSION"
ldflags+=" -X $MODULE/internal/version.gitTreeState=clean"
tmp="$(mktemp -d "$OUT/gobin.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# `go install pkg@version` builds the module with its own go.mod (helm has no replace
# directives), independent of any go.mod around the working directory.
(cd "$tmp" && CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS=-mod=mod \
  go install -trimpath -ldflags "$ldflags" "$MODULE/cmd/helm@$HELM_VERSION")
mv "$tmp/helm" "$BIN/helm"
"$BIN/helm" version --short >&2 || true
log "done: $BIN"
echo "$BIN"
