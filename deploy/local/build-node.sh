#!/usr/bin/env bash
# Builds what a real Kubernetes node needs on top of the control plane, from Go
# modules, into ~/.cache/kama/node/<key>/bin: kubelet and kube-proxy (the control
# plane's pinned release), containerd 2.x with ctr and the runc shim, the CNI plugins
# a bridge network uses, crictl, CoreDNS, and the static `pause` of Kubernetes' own
# source. runc, iptables and conntrack come from Debian (`make node-packages`).
# Serialised with flock and skipped when every binary is present, like build-k8s.sh.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=debian-packages.sh
source "$HERE/debian-packages.sh"
K8S_VERSION="${KAMA_K8S_VERSION:-v1.37.2}"
CONTAINERD_VERSION="${KAMA_CONTAINERD_VERSION:-v2.4.2}"
CNI_VERSION="${KAMA_CNI_VERSION:-v1.10.0}"
CRI_TOOLS_VERSION="${KAMA_CRI_TOOLS_VERSION:-v1.37.0}"
COREDNS_VERSION="${KAMA_COREDNS_VERSION:-v1.14.7}"
CACHE_ROOT="${KAMA_CACHE_DIR:-$HOME/.cache/kama}"
OUT="$CACHE_ROOT/node/k8s$K8S_VERSION-containerd$CONTAINERD_VERSION-cni$CNI_VERSION-coredns$COREDNS_VERSION"
BIN="$OUT/bin"
CNI_PLUGINS=(bridge host-local loopback portmap)
BINARIES=(kubelet kube-proxy containerd ctr containerd-shim-runc-v2 crictl coredns pause busybox "${CNI_PLUGINS[@]}")
# single-binary OCI archives for containerd (imported, never pulled)
IMAGES=(pause coredns busybox)
PAUSE_REF="registry.k8s.io/pause:3.10"
COREDNS_REF="kama.dev/coredns:$COREDNS_VERSION"
EPOCH="${SOURCE_DATE_EPOCH:-1704067200}"

log() { printf '[build-node %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# runc, iptables (kube-proxy, portmap), conntrack and socat (relays host services on
# loopback to the nodes' bridge) come from Debian
ensure_debian_packages build-node runc=runc iptables=iptables conntrack=conntrack socat=socat \
  || exit 1

all_present() {
  for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
  for i in "${IMAGES[@]}"; do [[ -f "$OUT/images/$i.tar" ]] || return 1; done
}

if all_present; then
  log "cached: $BIN"
  echo "$BIN"
  exit 0
fi

for tool in go gcc; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-node: $tool is not installed (need go >= 1.26 and gcc on PATH)" >&2
    exit 1
  fi
done

mkdir -p "$BIN" "$OUT/src"
exec 9>"$OUT/.build.lock"
flock 9
if all_present; then echo "$BIN"; exit 0; fi

# containerd, the CNI plugins and CoreDNS do not depend on the Kubernetes version: a
# node cache of another Kubernetes version with the same versions of these already has
# them (`make matrix` builds a second node set)
reuse_from_sibling() {  # <binary>
  local sibling
  for sibling in "$CACHE_ROOT"/node/k8s*-containerd"$CONTAINERD_VERSION"-cni"$CNI_VERSION"-coredns"$COREDNS_VERSION"/bin/"$1"; do
    [[ -x "$sibling" && "$sibling" != "$BIN/$1" ]] || continue
    log "reusing $1 from $(dirname "$sibling")"
    cp "$sibling" "$BIN/$1.tmp" && mv "$BIN/$1.tmp" "$BIN/$1"
    return 0
  done
  return 1
}

# `go install module/cmd@version` builds a released module exactly as published
install_tool() {  # <binary> <package@version> [build tags]
  local name="$1" pkg="$2" tags="${3:-}"
  [[ -x "$BIN/$name" ]] && return 0
  [[ "$name" != crictl ]] && reuse_from_sibling "$name" && return 0
  log "building $name ($pkg)"
  local tmp="$OUT/src/gobin-$name"
  rm -rf "$tmp" && mkdir -p "$tmp"
  GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -tags "$tags" -ldflags "-s -w" "$pkg"
  mv "$tmp/$(basename "${pkg%@*}")" "$BIN/$name"
  rm -rf "$tmp"
}

# kubelet and kube-proxy come from the control plane's module set (same replaces)
k8s_bin="$(bash "$HERE/build-k8s.sh")"
k8s_src="$(dirname "$k8s_bin")/src/kubernetes"
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
ldflags="-s -w"
for kv in "gitVersion=$K8S_VERSION" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" "buildDate=1970-01-01T00:00:00Z"; do
  ldflags+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
done
for b in kubelet kube-proxy; do
  [[ -x "$BIN/$b" ]] && continue
  log "building $b $K8S_VERSION"
  (cd "$k8s_src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b")
  mv "$BIN/$b.tmp" "$BIN/$b"
done

if [[ ! -x "$BIN/pause" ]]; then
  log "building pause from k8s.io/kubernetes $K8S_VERSION"
  pause_src="$(cd "$k8s_src" && go list -m -f '{{.Dir}}' "k8s.io/kubernetes")/build/pause/linux/pause.c"
  gcc -Os -static -DVERSION="\"$K8S_VERSION-kama\"" -o "$BIN/pause.tmp" "$pause_src"
  strip "$BIN/pause.tmp"
  mv "$BIN/pause.tmp" "$BIN/pause"
fi

containerd_tags="urfave_cli_no_docs osusergo netgo static_build no_btrfs no_devmapper no_zfs"
install_tool containerd "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" "$containerd_tags"
install_tool ctr "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" "$containerd_tags"
install_tool containerd-shim-runc-v2 "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" "$containerd_tags"
for p in "${CNI_PLUGINS[@]}"; do
  case "$p" in host-local) kind=ipam ;; portmap) kind=meta ;; *) kind=main ;; esac
  install_tool "$p" "github.com/containernetworking/plugins/plugins/$kind/$p@$CNI_VERSION"
done
install_tool crictl "sigs.k8s.io/cri-tools/cmd/crictl@$CRI_TOOLS_VERSION"
install_tool coredns "github.com/coredns/coredns@$COREDNS_VERSION"

# a shell for tests and debugging: Debian's busybox-static (the package's own binary)
if [[ ! -x "$BIN/busybox" ]]; then
  log "busybox from Debian's busybox-static"
  deb="$OUT/src/busybox" && rm -rf "$deb" && mkdir -p "$deb"
  (cd "$deb" && apt-get download busybox-static >/dev/null)
  dpkg-deb -x "$deb"/busybox-static_*.deb "$deb/root"
  cp "$deb/root/bin/busybox" "$BIN/busybox.tmp" && mv "$BIN/busybox.tmp" "$BIN/busybox"
  rm -rf "$deb"
fi

# one layer with the static binary (and links to it); containerd records the reference
single_binary_image() {  # <name> <ref> <binary> <config json> [links...]
  local name="$1" ref="$2" binary="$3" config="$4" work="$OUT/images/$1"
  shift 4
  [[ -f "$OUT/images/$name.tar" ]] && return 0
  log "image $ref"
  rm -rf "$work" && mkdir -p "$work"
  local links=()
  for link in "$@"; do links+=(--symlink "$link=/$binary"); done
  python3 "$HERE/../images/oci.py" layer "$work/layer.tar.gz" --epoch "$EPOCH" \
    --file "$binary=$BIN/$binary" --mode "$binary=0755" --mkdir bin --mkdir tmp "${links[@]}" >/dev/null
  python3 "$HERE/../images/oci.py" image "$work/layout" --epoch "$EPOCH" --ref "$ref" \
    --config "$config" --layer "$work/layer.tar.gz" >/dev/null
  mv "$work/layout.tar" "$OUT/images/$name.tar"
  rm -rf "$work"
}
mkdir -p "$OUT/images"
single_binary_image pause "$PAUSE_REF" pause '{"User":"65535:65535","Entrypoint":["/pause"]}'
single_binary_image coredns "$COREDNS_REF" coredns '{"User":"65532:65532","Entrypoint":["/coredns"]}'
busybox_version="$("$BIN/busybox" --help 2>&1 | sed -n '1s/^BusyBox v\([0-9.]*\).*/\1/p')" || true
single_binary_image busybox "kama.dev/busybox:${busybox_version:-unknown}" busybox \
  '{"Env":["PATH=/bin"],"Cmd":["sh"]}' \
  bin/sh bin/sleep bin/cat bin/echo bin/ls bin/id bin/touch bin/mkdir bin/wget bin/nslookup bin/head bin/dd bin/true

all_present
log "done: $BIN"
echo "$BIN"
