#!/usr/bin/env bash
# The test command: set up what is missing (scripts/bootstrap.sh), then run the whole suite
# against the real Docker engine. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/test_fixtures.sh
# --no-cache: a stale cache once hid a lint error that CI (fresh clone) then found.
.venv/bin/ruff check --no-cache .
.venv/bin/ruff format --check --no-cache .
.venv/bin/mypy client/src daemon/src loadtest/src
exec .venv/bin/pytest "$@"
