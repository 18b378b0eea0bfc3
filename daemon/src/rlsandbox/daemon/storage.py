"""The node's SQLite files (session journal, event outbox, aggregator store) open one way."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def open_wal(path: Path, *, timeout: float = 5.0) -> Iterator[sqlite3.Connection]:
    """A connection to ``path`` (created with its folders) in WAL mode, NORMAL sync (the rows must
    outlive the process, not the machine), usable from a worker thread. If the set-up inside the
    block fails, the connection is closed again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, timeout=timeout, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        yield db
    except BaseException:
        db.close()
        raise
