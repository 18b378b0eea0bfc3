"""The durable on-disk outbox: events that could not be published yet, in order.

A SQLite file (WAL), one row per message (an event, or a batch of step events; ``count`` counts
events): rows keep their insertion order (INTEGER PRIMARY KEY), are replayed from the
oldest, and are deleted only after JetStream acknowledged them. Bounded by the bytes of their
payloads: ``append`` accepts what fits and says how many it took, so the publisher can count and
report the rest instead of dropping them silently. Blocking calls: the publisher runs them in a
worker thread.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from rlsandbox.daemon.storage import open_wal


class Outbox:
    def __init__(self, path: str | Path, max_bytes: int) -> None:
        """No I/O here: :meth:`open` opens (or creates) the file."""
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self.count = self.bytes = 0

    @classmethod
    def opened(cls, path: str | Path, max_bytes: int) -> Outbox:
        outbox = cls(path, max_bytes)
        outbox.open()
        return outbox

    def open(self) -> None:
        if self._db is not None:
            return
        with open_wal(self.path) as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS outbox "
                "(id INTEGER PRIMARY KEY, subject TEXT NOT NULL, msg_id TEXT NOT NULL, payload BLOB NOT NULL, "
                "events INTEGER NOT NULL DEFAULT 1)"
            )
            # Messages NATS refused for their content (too large for the server, say): kept for
            # inspection, never retried, so that they cannot block what comes after them.
            db.execute(
                "CREATE TABLE IF NOT EXISTS dead_letter "
                "(id INTEGER PRIMARY KEY, subject TEXT NOT NULL, msg_id TEXT NOT NULL, payload BLOB NOT NULL, "
                "events INTEGER NOT NULL, reason TEXT NOT NULL, at REAL NOT NULL)"
            )
            row = db.execute("SELECT COALESCE(SUM(events), 0), COALESCE(SUM(LENGTH(payload)), 0) FROM outbox").fetchone()
        self._db = db
        self.count, self.bytes = int(row[0]), int(row[1])

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError(f"outbox {self.path} is not open")
        return self._db

    def append(self, records: list[tuple[str, str, bytes, int]]) -> int:
        """Store (subject, msg_id, payload, events in it) records in order, as many as fit;
        returns how many records were taken."""
        with self._lock:
            room = self.max_bytes - self.bytes
            taken: list[tuple[str, str, bytes, int]] = []
            for rec in records:
                if len(rec[2]) > room:
                    break
                room -= len(rec[2])
                taken.append(rec)
            if taken:
                with self.db:
                    self.db.execute("BEGIN")
                    self.db.executemany("INSERT INTO outbox (subject, msg_id, payload, events) VALUES (?, ?, ?, ?)", taken)
                self.count += sum(r[3] for r in taken)
                self.bytes += sum(len(r[2]) for r in taken)
            return len(taken)

    def peek(self, limit: int) -> list[tuple[int, str, str, bytes, int]]:
        """The oldest ``limit`` records: (row id, subject, msg_id, payload, events in it)."""
        with self._lock:
            rows = self.db.execute(
                "SELECT id, subject, msg_id, payload, events FROM outbox ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
        return [(int(r[0]), str(r[1]), str(r[2]), bytes(r[3]), int(r[4])) for r in rows]

    def remove_through(self, row_id: int) -> None:
        """Delete every record up to and including ``row_id`` (they were acknowledged)."""
        with self._lock, self.db:
            self.db.execute("BEGIN")
            row = self.db.execute(
                "SELECT COALESCE(SUM(events), 0), COALESCE(SUM(LENGTH(payload)), 0) FROM outbox WHERE id <= ?", (row_id,)
            ).fetchone()
            self.db.execute("DELETE FROM outbox WHERE id <= ?", (row_id,))
            self.count -= int(row[0])
            self.bytes -= int(row[1])

    def dead_letter(self, record: tuple[str, str, bytes, int], reason: str) -> None:
        """Keep a refused message apart (at most the first MiB of its payload)."""
        subject, msg_id, payload, events = record
        with self._lock, self.db:
            self.db.execute(
                "INSERT INTO dead_letter (subject, msg_id, payload, events, reason, at) VALUES (?, ?, ?, ?, ?, ?)",
                (subject, msg_id, payload[: 1 << 20], events, reason[:1000], time.time()),
            )

    def dead_letters(self) -> list[tuple[str, str, int, str]]:
        """(subject, msg_id, events, reason) of every dead-lettered message, oldest first."""
        with self._lock:
            rows = self.db.execute("SELECT subject, msg_id, events, reason FROM dead_letter ORDER BY id").fetchall()
        return [(str(r[0]), str(r[1]), int(r[2]), str(r[3])) for r in rows]

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
