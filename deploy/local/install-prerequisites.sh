#!/usr/bin/env bash
# What `make setup` and the tests need of the machine, so that one with only Debian,
# Python 3.11 and `make` can run them: the compilers, cmake, curl, git and a few base
# tools, and what the nodes, the image build and Temporal's test server use (runc,
# iptables, conntrack, socat, mmdebstrap, umoci, a Java runtime), from Debian's
# packages (apt-get, as root: debian-packages.sh); and Go >= 1.26, which Debian does
# not package. Go comes from the Go module proxy's `golang.org/toolchain` module (the
# zip `go` itself downloads when a go.mod asks for a newer toolchain), checked against
# the sha256 pinned below and unpacked into ~/.cache/kama/go/go<version>;
# ~/.cache/kama/go/current points at it and the Makefile puts current/bin first on
# PATH. A tool already present is used as it is; a second run does nothing.
# `install-prerequisites.sh uv` installs only uv (pip, from PyPI), which every Python
# target needs.
set -euo pipefail

GO_VERSION="${KAMA_GO_VERSION:-1.26.8}"
GO_MINOR_NEEDED=26
# sha256 of proxy.golang.org's golang.org/toolchain@v0.0.1-go1.26.8.linux-amd64.zip,
# taken when it was pinned (sum.golang.org is not reachable from these machines)
GO_SHA256="${KAMA_GO_SHA256:-30c2b1bf7dcc88d3eb0a1364e47ddd9128edb3110a30e8a0ef61cd5856b31de7}"
CACHE_ROOT="${KAMA_CACHE_DIR:-$HOME/.cache/kama}"
GO_ROOT="$CACHE_ROOT/go"

log() { printf '[prerequisites %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'install-prerequisites: %s\n' "$*" >&2; exit 1; }

# shellcheck source=debian-packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian-packages.sh"

# what `make setup` and the tests use from Debian, as <command>=<package>: the build
# tools, then what the nodes (runc, iptables, conntrack, socat), the image build
# (mmdebstrap, umoci) and Temporal's test server (a Java runtime) need, installed here
# once so that nothing is installed while the tests run
BUILD_PACKAGES=(
  gcc=gcc g++=g++ c++=g++ make=make cmake=cmake curl=curl git=git tar=tar
  sha256sum=coreutils flock=util-linux xz=xz-utils update-ca-certificates=ca-certificates
)
TEST_PACKAGES=(
  runc=runc iptables=iptables conntrack=conntrack socat=socat mmdebstrap=mmdebstrap
  umoci=umoci java=openjdk-17-jre-headless
)

go_is_recent() {  # the `go` on PATH (the Makefile's PATH: the cached one first) is >= 1.26
  local version
  version="$(go env GOVERSION 2>/dev/null)" || return 1
  version="${version#go}"
  [[ "${version%%.*}" -gt 1 ]] || [[ "${version%%.*}" -eq 1 && "$(cut -d. -f2 <<<"$version")" -ge $GO_MINOR_NEEDED ]]
}

install_go() {
  PATH="$GO_ROOT/current/bin:$PATH"
  if go_is_recent; then return 0; fi
  local dest="$GO_ROOT/go$GO_VERSION" proxy zip
  if [[ ! -x "$dest/bin/go" ]]; then
    proxy="${GOPROXY:-https://proxy.golang.org}"
    proxy="${proxy%%,*}"
    [[ "$proxy" == direct || "$proxy" == off ]] && proxy=https://proxy.golang.org
    mkdir -p "$GO_ROOT"
    zip="$GO_ROOT/go$GO_VERSION.zip.part"
    log "downloading Go $GO_VERSION from $proxy (golang.org/toolchain)"
    curl -fsSL --retry 3 -o "$zip" \
      "$proxy/golang.org/toolchain/@v/v0.0.1-go$GO_VERSION.linux-amd64.zip"
    echo "$GO_SHA256  $zip" | sha256sum -c --quiet - || die "Go $GO_VERSION: sha256 mismatch"
    rm -rf "$dest.part"
    # the zip's entries sit under golang.org/toolchain@<version>/ and carry their modes
    python3 - "$zip" "$dest.part" <<'PY'
import sys, zipfile
from pathlib import Path
archive, dest = sys.argv[1], Path(sys.argv[2])
with zipfile.ZipFile(archive) as z:
    for info in z.infolist():
        _, _, name = info.filename.partition("@")  # golang.org/toolchain@v…/
        name = name.partition("/")[2]
        if not name or info.is_dir():
            continue
        target = dest / name
        if not target.resolve().is_relative_to(dest.resolve()):
            raise SystemExit(f"unsafe path in the Go zip: {info.filename}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(z.read(info))
        mode = (info.external_attr >> 16) & 0o777
        target.chmod(mode or 0o644)
PY
    rm -f "$zip"
    mv "$dest.part" "$dest"
  fi
  ln -sfn "go$GO_VERSION" "$GO_ROOT/current"
  go_is_recent || die "Go $GO_VERSION in $dest does not run"
  log "Go $(go env GOVERSION) in $GO_ROOT/current/bin"
}

install_uv() {
  command -v uv >/dev/null 2>&1 && return 0
  local version="${UV_VERSION:?the Makefile passes UV_VERSION}"
  if ! python3 -m pip --version >/dev/null 2>&1; then
    ensure_debian_packages prerequisites pip3=python3-pip || exit 1
  fi
  # Debian's own python3 refuses pip installs (PEP 668) unless told: uv is a
  # stand-alone binary that touches nothing of the system's Python
  log "installing uv $version from PyPI"
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet "uv==$version" >&2
}

if [[ "${1:-}" == uv ]]; then
  install_uv
  exit 0
fi
ensure_debian_packages prerequisites "${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}" || exit 1
install_go
