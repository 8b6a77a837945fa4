#!/usr/bin/env bash
# What `make setup` needs before it builds anything, so that a machine with only
# Debian, Python 3.11 and `make` can run it: the C and C++ compilers, cmake, curl, git
# and a few base tools from Debian's packages (apt-get, as root), and Go >= 1.26, which
# Debian does not package. Go comes from the Go module proxy's `golang.org/toolchain`
# module (the zip `go` itself downloads when a go.mod asks for a newer toolchain),
# checked against the sha256 pinned below and unpacked into
# ~/.cache/kama/go/go<version>; ~/.cache/kama/go/current points at it and the Makefile
# puts current/bin first on PATH. A tool already present is used as it is; a second
# run does nothing. `install-prerequisites.sh uv` installs only uv (pip, from PyPI),
# which every Python target needs.
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

# tool -> the Debian package that provides it
declare -A PACKAGE_OF=(
  [gcc]=gcc [g++]=g++ [c++]=g++ [make]=make [cmake]=cmake [curl]=curl [git]=git
  [tar]=tar [sha256sum]=coreutils [flock]=util-linux [xz]=xz-utils
)

install_debian_packages() {
  local missing=() tool
  for tool in "${!PACKAGE_OF[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("${PACKAGE_OF[$tool]}")
  done
  [[ -f /etc/ssl/certs/ca-certificates.crt ]] || missing+=(ca-certificates)
  ((${#missing[@]})) || return 0
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null; then
    die "missing ${missing[*]}; on Debian: apt-get install -y ${missing[*]}"
  fi
  log "installing ${missing[*]} from Debian"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${missing[@]}") >&2
}

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
    [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null \
      || die "python3 has no pip; on Debian: apt-get install -y python3-pip"
    log "installing python3-pip from Debian"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends python3-pip) >&2
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
install_debian_packages
install_go
