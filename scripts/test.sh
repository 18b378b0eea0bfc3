#!/usr/bin/env bash
# The test command: set up what is missing (scripts/bootstrap.sh), then run the whole suite
# against the real Docker engine. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy client/src daemon/src loadtest/src
exec .venv/bin/pytest "$@"
