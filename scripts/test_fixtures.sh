#!/usr/bin/env bash
# Test fixtures from PyPI, fetched once into .venv/test-fixtures (the tests themselves reach
# nothing but this machine): the source archives of marshmallow whose trees are the base commits
# of SWE-bench Lite records (and the next release, a history to mine), and the wheels their tests
# need, for the dataset round trip
# (tests/integration/test_dataset_round_trip.py). Idempotent: a stamp names what was fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.venv/test-fixtures
want="marshmallow==3.0.0 marshmallow==3.0.1 | pip pytz simplejson python-dateutil setuptools<70"
[ "$(cat "$dest/.stamp" 2>/dev/null)" = "$want" ] && exit 0
rm -rf "$dest" && mkdir -p "$dest/sdists" "$dest/wheels"
pip=(.venv/bin/python -m pip download --quiet --disable-pip-version-check)
for version in 3.0.0 3.0.1; do  # two successive releases: a history to mine
  "${pip[@]}" --no-deps --no-binary :all: -d "$dest/sdists" "marshmallow==$version"
done
"${pip[@]}" --only-binary :all: --python-version 3.11 --implementation cp --platform manylinux2014_x86_64 \
  -d "$dest/wheels" pip pytz simplejson python-dateutil 'setuptools<70'
echo "$want" > "$dest/.stamp"
echo "[test fixtures] $(ls "$dest/sdists" "$dest/wheels" | grep -c '\.')" files in "$dest" >&2
