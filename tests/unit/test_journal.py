"""The session journal's writer: durable rows, coalesced progress, writes off the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from rlsandbox.daemon.journal import PROGRESS_INTERVAL, JournalEntry, SessionJournal


def entry(session: str) -> JournalEntry:
    return JournalEntry(
        session=session, pool="p", container=f"c-{session}", container_id="id", transport="dial", runtime="runc",
        image="img", options={"labels": {"run": "r"}}, task_spec=None, task_tar=b"", created_at=1.0, started_at=1.0,
        seq_reserved=32, steps=0,
    )  # fmt: skip


def on_disk(path: Path) -> dict[str, tuple[int, int, int]]:
    """What another process (the next life of the daemon) would read."""
    db = sqlite3.connect(path)
    try:
        return {r[0]: (r[1], r[2], r[3]) for r in db.execute("SELECT session, seq_reserved, emitted, steps FROM sessions")}
    finally:
        db.close()


async def test_rows_progress_and_forgetting(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    journal = SessionJournal.opened(path, "n1")
    writers: set[int] = set()
    apply = journal._apply

    def tracking(*args: object) -> None:
        writers.add(threading.get_ident())
        apply(*args)  # type: ignore[arg-type]

    journal._apply = tracking  # type: ignore[method-assign]
    await journal.record(entry("a"))
    assert on_disk(path) == {"a": (32, 0, 0)}  # durable once awaited
    journal.progress("a", seq_reserved=32, emitted=5, steps=4)  # coalesced, not urgent
    journal.progress("a", seq_reserved=32, emitted=6, steps=5)
    await asyncio.sleep(PROGRESS_INTERVAL * 3)
    assert on_disk(path) == {"a": (32, 6, 5)}
    await journal.progress("a", seq_reserved=64, emitted=17, steps=9, urgent=True)
    assert on_disk(path)["a"] == (64, 17, 9)
    await journal.record(entry("b"))
    journal.forget("a")
    journal.progress("b", seq_reserved=32, emitted=3, steps=2)
    await journal.close()  # writes what is pending
    assert on_disk(path) == {"b": (32, 3, 2)}
    assert writers and threading.get_ident() not in writers, "a journal write ran on the event loop's thread"
    again = SessionJournal.opened(path, "n1")
    [b] = again.load()
    assert (b.session, b.emitted, b.steps, b.options["labels"]) == ("b", 3, 2, {"run": "r"})
    await again.close()


async def test_an_old_file_gains_the_new_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE sessions (node TEXT NOT NULL, session TEXT NOT NULL, pool TEXT NOT NULL, container TEXT NOT NULL, "
        "container_id TEXT NOT NULL, transport TEXT NOT NULL, runtime TEXT NOT NULL, image TEXT NOT NULL, "
        "options BLOB NOT NULL, task_spec TEXT, task_tar BLOB, created_at REAL NOT NULL, started_at REAL NOT NULL, "
        "seq_reserved INTEGER NOT NULL, steps INTEGER NOT NULL, PRIMARY KEY (node, session)) WITHOUT ROWID"
    )
    db.execute("INSERT INTO sessions VALUES ('n1', 's', 'p', 'c', 'id', 'socket', 'runc', 'i', '{}', NULL, NULL, 1, 1, 32, 3)")
    db.commit()
    db.close()
    journal = SessionJournal.opened(path, "n1")
    [old] = journal.load()
    assert old.transport == "socket" and old.emitted == 0 and old.steps == 3
    await journal.close()


async def test_a_failing_write_never_leaves_a_caller_waiting(tmp_path: Path) -> None:
    journal = SessionJournal.opened(tmp_path / "j.sqlite3", "n1")

    def broken(*args: object) -> None:
        raise OSError("disk gone")

    journal._apply = broken  # type: ignore[method-assign]  # a fault that cannot be produced on demand
    await asyncio.wait_for(journal.record(entry("a")), 5)  # answered, not hung
    await asyncio.wait_for(journal.progress("a", seq_reserved=64, emitted=1, steps=1, urgent=True), 5)
    assert journal.write_errors == 2
    await journal.close()


async def test_a_task_workspace_is_stored_once_per_ref_and_dropped_when_unused(tmp_path: Path) -> None:
    """Task sessions name their workspace by the task's ref: a 20 MB workspace written into every
    session's row made each task session's hand-out wait ~200 ms for its row."""
    from dataclasses import replace

    path = tmp_path / "j.sqlite3"
    journal = SessionJournal.opened(path, "n1")
    tar = b"t" * 100_000
    a = replace(entry("a"), task_spec="{}", task_tar=tar, task_ref="calc@1")
    b = replace(entry("b"), task_spec="{}", task_tar=tar, task_ref="calc@1")
    await asyncio.gather(journal.record(a), journal.record(b))
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT COUNT(*), SUM(LENGTH(tar)) FROM task_tars").fetchone() == (1, 100_000)
        assert db.execute("SELECT COUNT(*) FROM sessions WHERE task_tar IS NOT NULL").fetchone() == (0,)
    finally:
        db.close()
    loaded = {e.session: e for e in journal.load()}
    assert loaded["a"].task_tar == tar and loaded["b"].task_ref == "calc@1"
    journal.forget("a")
    journal.forget("b")
    await journal.close()
    again = SessionJournal.opened(path, "n1")  # opening drops workspaces no session refers to
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT COUNT(*) FROM task_tars").fetchone() == (0,)
    finally:
        db.close()
    await again.close()
