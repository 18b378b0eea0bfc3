"""The aggregator's store on SQLite in a temporary folder: the cases every database passes
(tests/store_cases.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_cases import *  # noqa: F403 - the shared cases, collected here with this module's ``db``


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "a.sqlite3")
