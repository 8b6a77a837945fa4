#!/usr/bin/env bash
# Regenerates the Python modules of KEDA's external-scaler contract from
# externalscaler.proto (run after editing it; the output is committed):
# externalscaler_pb2.py, externalscaler_pb2.pyi and externalscaler_pb2_grpc.py.
# Uses grpcio-tools from the project's environment (a dev dependency).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"

cd "$here"
"$python" -m grpc_tools.protoc \
    --proto_path=. \
    --python_out=. \
    --pyi_out=. \
    --grpc_python_out=. \
    externalscaler.proto

# protoc writes `import externalscaler_pb2 as ...`, a top-level import; inside the
# gateway.keda package it must be relative.
sed -i 's/^import externalscaler_pb2 as /from . import externalscaler_pb2 as /' \
    externalscaler_pb2_grpc.py
grep -q '^from \. import externalscaler_pb2 as ' externalscaler_pb2_grpc.py
