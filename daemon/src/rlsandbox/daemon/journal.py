"""The session journal: what a restarted daemon needs to re-adopt its live sessions.

One SQLite row per READY session (WAL, no fsync per commit: the rows must outlive the daemon's
process, which a SIGKILL does not threaten, not the machine). A row is written when a session
becomes READY and deleted when it starts closing, so a row means "this session's sandbox should
still be there".

All writes go through one writer task that runs them in a worker thread, never on the event
loop, and commits whatever is pending as one transaction (group commit): ``record`` is awaited
(a session is handed out only once its row is durable); progress (steps, the last event number
emitted, the reserved block) is coalesced per session and follows within a commit, about a
millisecond. Event numbers are reserved in blocks ahead of use; an event whose number is not yet
durably reserved waits for it (the session manager holds it), so a re-adopted session never
reuses a number an earlier life of the daemon may have published. After a crash, the numbers
between the last one journalled as emitted and the end of the reserved block were never used,
or used in the last moment before the crash: the ``adopted`` event declares that window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from rlsandbox.daemon.storage import open_wal

log = logging.getLogger(__name__)

SEQ_BLOCK = 32
PROGRESS_INTERVAL = 0.02  # seconds the journal may lag behind steps and events

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    node TEXT NOT NULL, session TEXT NOT NULL, pool TEXT NOT NULL, container TEXT NOT NULL,
    container_id TEXT NOT NULL, transport TEXT NOT NULL, runtime TEXT NOT NULL, image TEXT NOT NULL,
    options BLOB NOT NULL, task_spec TEXT, task_tar BLOB, created_at REAL NOT NULL,
    started_at REAL NOT NULL, seq_reserved INTEGER NOT NULL, steps INTEGER NOT NULL,
    emitted INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (node, session)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS task_tars (
    node TEXT NOT NULL, ref TEXT NOT NULL, tar BLOB NOT NULL, PRIMARY KEY (node, ref)) WITHOUT ROWID;
"""
COLUMNS = (
    "session, pool, container, container_id, transport, runtime, image, options, task_spec, task_tar, "
    "created_at, started_at, seq_reserved, steps, emitted, task_ref"
)


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
    emitted: int = 0  # the last event number journalled as emitted
    # The task's ref (session/prefetch.py): its workspace tarball is stored once per ref, not in
    # every session's row (a 20 MB workspace made every task session's row cost ~200 ms).
    task_ref: str = ""


class SessionJournal:
    """Rows of one node's live sessions in a file that several nodes may share."""

    def __init__(self, path: str | Path, node: str) -> None:
        """No I/O here: :meth:`open` opens (or creates) the file."""
        self.path = Path(path)
        self.node = node
        self.write_errors = 0
        self._db: sqlite3.Connection | None = None
        self._stored_tars: set[str] = set()  # task refs whose workspace is in task_tars
        # Pending writes, in order (rows), and coalesced progress per session.
        self._ops: list[tuple[str, Any]] = []
        self._progress: dict[str, tuple[int, int, int]] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._urgent = asyncio.Event()
        self._last_flush = 0.0
        self._writer: asyncio.Task[None] | None = None
        self._closing = False

    @classmethod
    def opened(cls, path: str | Path, node: str) -> SessionJournal:
        journal = cls(path, node)
        journal.open()
        return journal

    def open(self) -> None:
        """Open (or create) the file; blocking I/O, so the daemon runs it in a worker thread."""
        if self._db is not None:
            return
        with open_wal(self.path, timeout=30) as db:
            db.executescript(SCHEMA)
            columns = {r[1] for r in db.execute("PRAGMA table_info(sessions)")}
            if "emitted" not in columns:  # a file of an earlier version
                db.execute("ALTER TABLE sessions ADD COLUMN emitted INTEGER NOT NULL DEFAULT 0")
            if "task_ref" not in columns:
                db.execute("ALTER TABLE sessions ADD COLUMN task_ref TEXT")
            # Workspaces no session of this node refers to any more.
            db.execute(
                "DELETE FROM task_tars WHERE node = ? AND ref NOT IN "
                "(SELECT task_ref FROM sessions WHERE node = ? AND task_ref IS NOT NULL)",
                (self.node, self.node),
            )
            stored = {r[0] for r in db.execute("SELECT ref FROM task_tars WHERE node = ?", (self.node,))}
        self._db = db
        self._stored_tars = stored

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError(f"session journal {self.path} is not open")
        return self._db

    def load(self) -> list[JournalEntry]:
        rows = self.db.execute(
            f"SELECT {COLUMNS} FROM sessions WHERE node = ? ORDER BY created_at",
            (self.node,),
        ).fetchall()
        tars = dict(self.db.execute("SELECT ref, tar FROM task_tars WHERE node = ?", (self.node,)).fetchall())
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
                    task_tar=r[9] or tars.get(r[15] or "", b""),
                    created_at=r[10],
                    started_at=r[11],
                    seq_reserved=r[12],
                    steps=r[13],
                    emitted=r[14],
                    task_ref=r[15] or "",
                )
            )
        return entries

    # -- the writer -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name="session-journal")

    async def close(self) -> None:
        """Write what is pending, stop the writer, close the file."""
        self._closing = True
        self._wake.set()
        if self._writer is not None:
            await self._writer
        else:
            await self._flush()
        if self._db is not None:
            await asyncio.to_thread(self._db.close)
            self._db = None

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._urgent.is_set() and not self._closing:
                # Progress alone waits a little to coalesce (at most PROGRESS_INTERVAL behind);
                # anything urgent (a new row, a reservation an event waits for) cuts it short.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, self._last_flush + PROGRESS_INTERVAL - loop.time())):
                        await self._urgent.wait()
            self._urgent.clear()
            self._last_flush = loop.time()
            await self._flush()
            if self._closing and not (self._ops or self._progress):
                return

    async def _flush(self) -> None:
        ops, progress, waiters = self._ops, self._progress, self._waiters
        self._ops, self._progress, self._waiters = [], {}, []
        try:
            if ops or progress:
                await asyncio.to_thread(self._apply, ops, progress)
        except Exception:  # whatever happens, the writer lives on and nobody waits forever
            self.write_errors += 1
            log.exception("session journal %s: write failed; a restart may not re-adopt these sessions", self.path)
        finally:
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    def _pending(self, urgent: bool = True) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        self._wake.set()
        if urgent:
            self._urgent.set()
        if self._writer is None and not self._closing:
            self.start()
        return future

    def _apply(self, ops: list[tuple[str, Any]], progress: dict[str, tuple[int, int, int]]) -> None:
        """One transaction (worker thread). A failed write (disk full, file removed) costs
        re-adoption of those sessions, never a call."""
        try:
            with self.db:
                self.db.execute("BEGIN")
                for kind, args in ops:
                    if kind == "record":
                        self.db.execute(f"INSERT OR REPLACE INTO sessions ({COLUMNS}, node) VALUES ({'?, ' * 16}?)", args)
                    elif kind == "tar":
                        self.db.execute("INSERT OR IGNORE INTO task_tars (node, ref, tar) VALUES (?, ?, ?)", args)
                    else:
                        self.db.execute("DELETE FROM sessions WHERE node = ? AND session = ?", (self.node, args))
                self.db.executemany(
                    "UPDATE sessions SET seq_reserved = ?, emitted = ?, steps = ? WHERE node = ? AND session = ?",
                    [(r, e, st, self.node, sid) for sid, (r, e, st) in progress.items()],
                )
        except sqlite3.Error as e:
            self.write_errors += 1
            log.warning("session journal %s: write failed (%s); a restart may not re-adopt these sessions", self.path, e)

    def record(self, entry: JournalEntry) -> asyncio.Future[None]:
        """Write a session's row; the future is done once it is durable."""
        self._progress.pop(entry.session, None)
        by_ref = bool(entry.task_ref and entry.task_tar)
        if by_ref and entry.task_ref not in self._stored_tars:
            self._stored_tars.add(entry.task_ref)
            self._ops.append(("tar", (self.node, entry.task_ref, entry.task_tar)))
        args = (
            entry.session,
            entry.pool,
            entry.container,
            entry.container_id,
            entry.transport,
            entry.runtime,
            entry.image,
            orjson.dumps(entry.options),
            entry.task_spec,
            None if by_ref else entry.task_tar or None,
            entry.created_at,
            entry.started_at,
            entry.seq_reserved,
            entry.steps,
            entry.emitted,
            entry.task_ref or None,
            self.node,
        )
        self._ops.append(("record", args))
        return self._pending()

    def progress(
        self, session: str, *, seq_reserved: int, emitted: int, steps: int, urgent: bool = False
    ) -> asyncio.Future[None]:
        """Event numbers up to ``seq_reserved`` may be used (the next life starts above), the last
        one emitted, the steps run. Coalesced, written within PROGRESS_INTERVAL (at once when
        ``urgent``); the future is done once it is durable."""
        self._progress[session] = (seq_reserved, emitted, steps)
        return self._pending(urgent)

    def forget(self, session: str) -> None:
        self._progress.pop(session, None)
        self._ops.append(("forget", session))
        self._pending()
