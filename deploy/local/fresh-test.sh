#!/usr/bin/env bash
# `make fresh-test`: the whole suite as a new user meets it, before an issue is called
# resolved: a clean clone of this checkout's HEAD in a scratch directory, run with an
# empty HOME (so no ~/.cache/kama, Go module or build cache, uv cache or helm config),
# `make setup` then `make test`, each timed. What is not under HOME (Debian's packages,
# a system Go, Python) is the machine's: `make setup` installs what is missing of it
# (deploy/local/install-prerequisites.sh). The scratch directory is kept with its
# test-results/ and the times (docs/development.md records them); remove it afterwards.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRATCH="${KAMA_FRESH_DIR:-$(mktemp -d /tmp/kama-fresh.XXXXXX)}"
TIMES="$SCRATCH/times.txt"

log() { printf '[fresh-test %s] %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$TIMES" >&2; }

mkdir -p "$SCRATCH/home"
[[ -z "$(ls -A "$SCRATCH/home")" ]] || { echo "fresh-test: $SCRATCH/home is not empty" >&2; exit 1; }
git clone --quiet --no-hardlinks "$REPO" "$SCRATCH/kama"
log "clone of $(git -C "$SCRATCH/kama" rev-parse --short HEAD) in $SCRATCH/kama, HOME=$SCRATCH/home"

timed() {  # timed <name> <make target>: runs it in the clone, logs its wall-clock time
  local started status=0
  started=$(date +%s)
  (cd "$SCRATCH/kama" && env -u KAMA_CACHE_DIR -u GOPATH -u GOCACHE -u GOMODCACHE \
    -u UV_CACHE_DIR HOME="$SCRATCH/home" make "$2") >"$SCRATCH/$1.log" 2>&1 || status=$?
  log "$1: $(( ($(date +%s) - started) / 60 )) min $(( ($(date +%s) - started) % 60 )) s, exit $status"
  return "$status"
}

started=$(date +%s)
status=0
timed setup setup && timed test test || status=$?
log "fresh set-up + test: $(( ($(date +%s) - started) / 60 )) min $(( ($(date +%s) - started) % 60 )) s, exit $status (logs: $SCRATCH/*.log, $SCRATCH/kama/test-results)"
exit "$status"
