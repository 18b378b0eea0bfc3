"""Fixtures of the fast tier."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from rlsandbox.daemon import logs


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The process's log lines as JSON, into a buffer (pool logs at WARNING and above)."""
    out = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    logs.configure("INFO,rlsandbox.daemon.pool=WARNING", "json", stream=out)
    try:
        yield out
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.getLogger("rlsandbox.daemon.pool").setLevel(logging.NOTSET)
        logs._node_fields.clear()
