"""The session journal: what a restarted daemon needs to re-adopt its live sessions.

One SQLite row per READY session (WAL, no fsync per commit: the rows must outlive the daemon's
process, which a SIGKILL does not threaten, not the machine). A row is written when a session
becomes READY and deleted when it starts closing, so a row means "this session's sandbox should
still be there". Event sequence numbers are reserved in blocks (one write per ``SEQ_BLOCK``
events, not per step), so a re-adopted session never reuses a number an earlier life of the
daemon may have published.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger(__name__)

SEQ_BLOCK = 32

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    node TEXT NOT NULL, session TEXT NOT NULL, pool TEXT NOT NULL, container TEXT NOT NULL,
    container_id TEXT NOT NULL, transport TEXT NOT NULL, runtime TEXT NOT NULL, image TEXT NOT NULL,
    options BLOB NOT NULL, task_spec TEXT, task_tar BLOB, created_at REAL NOT NULL,
    started_at REAL NOT NULL, seq_reserved INTEGER NOT NULL, steps INTEGER NOT NULL,
    PRIMARY KEY (node, session)) WITHOUT ROWID;
"""


@dataclass(frozen=True, slots=True)
class JournalEntry:
    session: str
    pool: str
    container: str
    container_id: str
    transport: str  # "dial", "attach" or "exec" ("socket": an earlier version's, never adopted)
    runtime: str
    image: str
    options: dict[str, Any]  # env, workdir, idle_timeout, max_lifetime, labels, idempotency_key
    task_spec: str | None
    task_tar: bytes
    created_at: float  # wall clock
    started_at: float  # wall clock: the lifetime counts from here
    seq_reserved: int
    steps: int


class SessionJournal:
    """Rows of one node's live sessions in a file that several nodes may share."""

    def __init__(self, path: str | Path, node: str) -> None:
        self.path = Path(path)
        self.node = node
        self.write_errors = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def load(self) -> list[JournalEntry]:
        rows = self._db.execute(
            "SELECT session, pool, container, container_id, transport, runtime, image, options, task_spec, task_tar, "
            "created_at, started_at, seq_reserved, steps FROM sessions WHERE node = ? ORDER BY created_at",
            (self.node,),
        ).fetchall()
        entries = []
        for r in rows:
            entries.append(
                JournalEntry(
                    session=r[0],
                    pool=r[1],
                    container=r[2],
                    container_id=r[3],
                    transport=r[4],
                    runtime=r[5],
                    image=r[6],
                    options=orjson.loads(r[7]),
                    task_spec=r[8],
                    task_tar=r[9] or b"",
                    created_at=r[10],
                    started_at=r[11],
                    seq_reserved=r[12],
                    steps=r[13],
                )
            )
        return entries

    def _write(self, sql: str, args: tuple[Any, ...]) -> None:
        """A failed write (disk full, file removed) costs re-adoption of that session, never the call."""
        try:
            self._db.execute(sql, args)
        except sqlite3.Error as e:
            self.write_errors += 1
            log.warning("session journal %s: write failed (%s); a restart may not re-adopt this session", self.path, e)

    def record(self, entry: JournalEntry) -> None:
        self._write(
            "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self.node,
                entry.session,
                entry.pool,
                entry.container,
                entry.container_id,
                entry.transport,
                entry.runtime,
                entry.image,
                orjson.dumps(entry.options),
                entry.task_spec,
                entry.task_tar or None,
                entry.created_at,
                entry.started_at,
                entry.seq_reserved,
                entry.steps,
            ),
        )

    def reserve(self, session: str, seq_reserved: int, steps: int) -> None:
        """Event numbers up to ``seq_reserved`` may be in use (the next life starts above)."""
        self._write(
            "UPDATE sessions SET seq_reserved = ?, steps = ? WHERE node = ? AND session = ?",
            (seq_reserved, steps, self.node, session),
        )

    def forget(self, session: str) -> None:
        self._write("DELETE FROM sessions WHERE node = ? AND session = ?", (self.node, session))

    def close(self) -> None:
        self._db.close()
