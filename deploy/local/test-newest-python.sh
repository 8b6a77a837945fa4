#!/usr/bin/env bash
# The package supports Python 3.11 to 3.13: run the pure tests on the newest (3.13)
# in an environment of its own, and install the `kama` command from the repository
# as a user would (`uv tool install .`), checking that it runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION="${KAMA_NEWEST_PYTHON:-3.13}"
CACHE_ROOT="${KAMA_CACHE:-$HOME/.cache/kama}"
log() { printf '[newest-python %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# an interpreter that answers (a pyenv shim for a version pyenv has not selected fails)
python=""
for candidate in "python$VERSION" "$(pyenv root 2>/dev/null)"/versions/"$VERSION"*/bin/"python$VERSION"; do
  if found="$(command -v "$candidate" 2>/dev/null)" && "$found" --version >/dev/null 2>&1; then
    python="$found"
    break
  fi
done
if [[ -z "$python" ]]; then
  log "no Python $VERSION here: install it (e.g. pyenv install $VERSION) to run this lane"
  exit 1
fi
log "$("$python" --version) at $python"

export UV_PROJECT_ENVIRONMENT="$CACHE_ROOT/venv-py$VERSION"
uv sync --frozen --quiet --python "$python"
"$UV_PROJECT_ENVIRONMENT/bin/pytest" -p no:cacheprovider -q tests/unit

tools="$(mktemp -d)"
trap 'rm -rf "$tools"' EXIT
UV_TOOL_DIR="$tools/tools" UV_TOOL_BIN_DIR="$tools/bin" \
  uv tool install --quiet --python "$python" .
# (not `tee /dev/stderr`: where stderr is a file, tee's open truncates it, the whole
# `make test` log with it)
said="$("$tools/bin/kama" version)"
printf '%s\n' "$said" >&2
grep -q "^python $VERSION\." <<<"$said"
log "kama installed with uv tool install runs on Python $VERSION"
