#!/usr/bin/env bash
# The run command: set up what is missing (scripts/bootstrap.sh), then start the node daemon with
# its embedded defaults, run a demo episode through the client, and keep serving until Ctrl-C.
# Extra arguments go to `rlsandbox up` (for example --demo-only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/rlsandbox up "$@"
