#!/usr/bin/env bash
# Regenerates the committed protobuf/gRPC code of proto/ into client/src (rlsandbox.v1).
# tests/unit/test_generated_code.py fails when the committed code differs from a fresh run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-client/src}
.venv/bin/python -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  proto/rlsandbox/v1/sandbox.proto
