#!/usr/bin/env bash
# Builds the Kubernetes control plane (kube-apiserver, kube-scheduler,
# kube-controller-manager) and etcd from Go modules into
# ~/.cache/kama/k8s/<version>/bin. There is no Docker and no release download
# on the machines Kama is developed on, but the Go module proxy is reachable,
# so the pinned releases are compiled from their published modules once and
# reused afterwards (the build is skipped when every binary is present).
set -euo pipefail

K8S_VERSION="${KAMA_K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${KAMA_ETCD_VERSION:-v3.6.16}"
CACHE_ROOT="${KAMA_CACHE_DIR:-$HOME/.cache/kama}"
OUT="$CACHE_ROOT/k8s/$K8S_VERSION-etcd$ETCD_VERSION"
BIN="$OUT/bin"
BINARIES=(etcd kube-apiserver kube-scheduler kube-controller-manager)

log() { printf '[build-k8s %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

all_present() {
  for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
}

if all_present; then
  log "cached: $BIN"
  echo "$BIN"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "build-k8s: Go is not installed (need go >= 1.26 on PATH to build Kubernetes $K8S_VERSION from modules)" >&2
  exit 1
fi

mkdir -p "$BIN" "$OUT/src/etcd" "$OUT/src/kubernetes"
# one build at a time per cache entry (tests, make dev and CI may all ask at once)
exec 9>"$OUT/.build.lock"
flock 9
if all_present; then echo "$BIN"; exit 0; fi
staging_version="v0${K8S_VERSION#v1}"   # v1.37.2 -> v0.37.2 for the k8s.io/* staging modules
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"

for sibling in "$CACHE_ROOT"/k8s/*-etcd"$ETCD_VERSION"/bin/etcd; do  # etcd is the same for every Kubernetes
  [[ ! -x "$BIN/etcd" && -x "$sibling" ]] || continue
  log "reusing etcd $ETCD_VERSION from $(dirname "$sibling")"
  cp "$sibling" "$BIN/etcd.tmp" && mv "$BIN/etcd.tmp" "$BIN/etcd"
done
if [[ ! -x "$BIN/etcd" ]]; then
  log "building etcd $ETCD_VERSION"
  cd "$OUT/src/etcd"
  cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  rm -f go.mod go.sum
  go mod init kama.local/etcd >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  go mod tidy
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" .
  mv "$BIN/etcd.tmp" "$BIN/etcd"
fi

cd "$OUT/src/kubernetes"
if [[ ! -f go.mod ]]; then
  log "resolving k8s.io/kubernetes $K8S_VERSION and its staging modules ($staging_version)"
  go mod init kama.local/kubernetes >/dev/null 2>&1
  modfile="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  # Every `k8s.io/X => ./staging/src/k8s.io/X` replace of the upstream go.mod
  # becomes a replace to the published module at the matching staging version.
  grep -E '^\s*k8s\.io/[^ ]+ => \./staging/' "$modfile" | awk '{print $1}' | while read -r mod; do
    go mod edit -replace "$mod=$mod@$staging_version"
  done
  go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
fi

ldflags="-s -w"
for kv in "gitVersion=$K8S_VERSION" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" "buildDate=1970-01-01T00:00:00Z"; do
  ldflags+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
done

for b in kube-apiserver kube-scheduler kube-controller-manager; do
  [[ -x "$BIN/$b" ]] && continue
  log "building $b $K8S_VERSION (first build takes a while on 2 cores)"
  CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b"
  mv "$BIN/$b.tmp" "$BIN/$b"
done

all_present
log "done: $BIN"
echo "$BIN"
