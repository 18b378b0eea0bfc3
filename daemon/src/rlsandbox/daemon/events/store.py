"""The aggregator's store: an embedded SQLite database (WAL), written idempotently.

Session events are keyed by (session, seq): an event that arrives twice (redelivery, a replayed
outbox) is counted as a duplicate and changes nothing else. What the events say is kept in plain
tables (sessions, steps, rewards, nodes, alerts) that the queries read; gaps are the sequence
numbers a session has not delivered (its highest seq minus the events it has), except inside a
window a restarted daemon declared (``unused_seq_window``: numbers its earlier life did not
journal as emitted). Numbers are used in order, so inside a window a missing number below one
that arrived was used and lost (``crash_window_lost``, counted in ``missing_events`` too); the
missing numbers above the highest that arrived were never used, or used in the journal's last
moment before the crash (``crash_window_unused``).
Several aggregator processes may share one database file (SQLite serialises their writes).
"""

from __future__ import annotations

import bisect
import math
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
from rlsandbox.daemon.events.anomalies import WindowStats
from rlsandbox.daemon.events.model import ALERT, CLOSED, CREATED, FAILED, FILES, HEARTBEAT, REWARD, STEP, decode_all
from rlsandbox.daemon.storage import open_wal

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    session TEXT NOT NULL, seq INTEGER NOT NULL, node TEXT NOT NULL, type TEXT NOT NULL, ts REAL NOT NULL,
    payload BLOB NOT NULL, PRIMARY KEY (session, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions (
    session TEXT PRIMARY KEY, node TEXT NOT NULL, run TEXT, task TEXT, labels TEXT NOT NULL DEFAULT '{}',
    created_ts REAL, ended_ts REAL, state TEXT NOT NULL DEFAULT 'open', end_reason TEXT,
    steps INTEGER NOT NULL DEFAULT 0, events INTEGER NOT NULL DEFAULT 0, max_seq INTEGER NOT NULL DEFAULT 0,
    duplicates INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS sessions_run ON sessions (run);
CREATE TABLE IF NOT EXISTS rewards (
    session TEXT NOT NULL, seq INTEGER NOT NULL, run TEXT, task TEXT, status TEXT NOT NULL, reward REAL,
    resolved INTEGER NOT NULL, ts REAL NOT NULL, PRIMARY KEY (session, seq)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS rewards_run ON rewards (run);
CREATE INDEX IF NOT EXISTS rewards_task ON rewards (task);
CREATE TABLE IF NOT EXISTS node_events (key TEXT PRIMARY KEY, node TEXT NOT NULL, type TEXT NOT NULL, ts REAL NOT NULL,
    payload BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS nodes (node TEXT PRIMARY KEY, last_heartbeat REAL NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS alerts (key TEXT PRIMARY KEY, node TEXT NOT NULL, session TEXT, kind TEXT NOT NULL,
    ts REAL NOT NULL, data TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS seq_windows (session TEXT NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL,
    PRIMARY KEY (session, lo)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_run_created ON sessions (run, created_ts);
CREATE INDEX IF NOT EXISTS rewards_run_ts ON rewards (run, ts);
CREATE INDEX IF NOT EXISTS alerts_ts ON alerts (ts);
-- Rollups the dashboard reads (so a run of 100k episodes is never loaded whole): per second,
-- what happened; per minute, how long steps took (counts per latency bucket, LATENCY_BOUNDS).
CREATE TABLE IF NOT EXISTS activity (second INTEGER PRIMARY KEY, steps INTEGER NOT NULL DEFAULT 0,
    created INTEGER NOT NULL DEFAULT 0, ended INTEGER NOT NULL DEFAULT 0, graded INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS step_latency (minute INTEGER NOT NULL, bucket INTEGER NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (minute, bucket)) WITHOUT ROWID;
"""
# Upper bounds (seconds) of the step latency buckets; the last one is open.
LATENCY_BOUNDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, math.inf)

RUN_LABEL = "run"
TASK_LABEL = "task"
BUCKETS = (0.0, 0.25, 0.5, 0.75, 1.0)


class Store:
    def __init__(self, path: str | Path, *, run_label: str = RUN_LABEL, task_label: str = TASK_LABEL) -> None:
        self.path = Path(path)
        self.run_label = run_label
        self.task_label = task_label
        self._lock = threading.Lock()
        with open_wal(self.path, timeout=60) as db:
            db.execute("PRAGMA busy_timeout=60000")
            db.executescript(SCHEMA)
            _add_column(db, "rewards", "tampering INTEGER NOT NULL DEFAULT 0")  # stores made before it
            # The events counted once (a store made before the counter), then kept by apply().
            db.execute("INSERT OR IGNORE INTO counters (name, value) SELECT 'events', COUNT(*) FROM events")
        self._db = db

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writes ---------------------------------------------------------------------------------
    def apply(self, payloads: Iterable[bytes]) -> tuple[int, int, int]:
        """Write a batch in one transaction; returns (new events, duplicates, invalid).

        Fast path: steps (most events) are inserted with one executemany and their sessions
        updated once per session; when that insert meets a duplicate, the batch is rolled back to
        the savepoint and applied event by event instead.
        """
        decoded: list[tuple[dict[str, Any], bytes]] = []
        bad = 0
        for payload in payloads:
            try:
                events, batch = decode_all(payload)
            except ValueError:
                bad += 1
                continue
            if batch:  # each event of a batch (even of one) is stored as its own JSON
                decoded.extend((ev, orjson.dumps(ev)) for ev in events)
            else:
                decoded.append((events[0], payload))
        new = dup = stored = 0  # stored: new session events (the events table; node events are apart)
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            steps = [(ev, p) for ev, p in decoded if ev["type"] == STEP and ev["session"]]
            others = [(ev, p) for ev, p in decoded if not (ev["type"] == STEP and ev["session"])]
            if steps and not self._steps_fast(steps):
                others = decoded  # a duplicate among the steps: do them one by one
            for ev, payload in others:
                if self._apply_one(ev, payload):
                    new += 1
                    stored += 1 if ev["session"] else 0
                else:
                    dup += 1
            if others is not decoded:
                new += len(steps)
                stored += len(steps)
            self._bump("duplicates", dup)
            self._bump("events", stored)  # the count integrity() reports, without counting the table
            self._bump("invalid", bad)
        return new, dup, bad

    def _steps_fast(self, steps: list[tuple[dict[str, Any], bytes]]) -> bool:
        """Insert step events in bulk; False (and nothing written) if any was there already."""
        db = self._db
        db.execute("SAVEPOINT steps")
        before = db.total_changes
        db.executemany(
            "INSERT OR IGNORE INTO events (session, seq, node, type, ts, payload) VALUES (?, ?, ?, 'step', ?, ?)",
            [(ev["session"], ev["seq"], ev["node"], float(ev["ts"]), p) for ev, p in steps],
        )
        if db.total_changes - before != len(steps):
            db.execute("ROLLBACK TO steps")
            db.execute("RELEASE steps")
            return False
        per_session: dict[str, list[Any]] = {}
        for ev, _ in steps:
            row = per_session.get(ev["session"])
            if row is None:
                labels = ev["labels"]
                run, task = labels.get(self.run_label), labels.get(self.task_label)
                per_session[ev["session"]] = [ev["session"], ev["node"], run, task, orjson.dumps(labels).decode(), 1, ev["seq"]]
            else:
                row[5] += 1
                row[6] = max(row[6], ev["seq"])
        db.executemany(
            "INSERT INTO sessions (session, node, run, task, labels, events, max_seq, steps) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(session) DO UPDATE SET events = events + excluded.events, steps = steps + excluded.steps, "
            "max_seq = MAX(max_seq, excluded.max_seq)",
            [(*r, r[5]) for r in per_session.values()],
        )
        self._rollup_steps([ev for ev, _ in steps])
        db.execute("RELEASE steps")
        return True

    def _rollup_steps(self, steps: list[dict[str, Any]]) -> None:
        """Steps per second, and their latencies per minute and bucket."""
        per_second: dict[int, int] = {}
        per_bucket: dict[tuple[int, int], int] = {}
        for ev in steps:
            ts = float(ev["ts"])
            per_second[int(ts)] = per_second.get(int(ts), 0) + 1
            duration = ev["data"].get("duration")
            if isinstance(duration, int | float):
                key = (int(ts) // 60 * 60, bisect.bisect_left(LATENCY_BOUNDS, duration))
                per_bucket[key] = per_bucket.get(key, 0) + 1
        self._db.executemany(
            "INSERT INTO activity (second, steps) VALUES (?, ?) ON CONFLICT(second) DO UPDATE SET steps = steps + excluded.steps",
            list(per_second.items()),
        )
        self._db.executemany(
            "INSERT INTO step_latency (minute, bucket, n) VALUES (?, ?, ?) "
            "ON CONFLICT(minute, bucket) DO UPDATE SET n = n + excluded.n",
            [(m, b, n) for (m, b), n in per_bucket.items()],
        )

    def _activity(self, ts: float, column: str) -> None:
        self._db.execute(
            f"INSERT INTO activity (second, {column}) VALUES (?, 1) ON CONFLICT(second) DO UPDATE SET {column} = {column} + 1",
            (int(ts),),
        )

    def _bump(self, name: str, n: int) -> None:
        if n > 0:
            self._db.execute(
                "INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                (name, n),
            )

    def _apply_one(self, ev: dict[str, Any], payload: bytes) -> bool:
        db = self._db
        session, seq, node, typ, ts = ev["session"], ev["seq"], ev["node"], ev["type"], float(ev["ts"])
        data: dict[str, Any] = ev["data"]
        if not session:  # a node event
            key = f"{node}/{data.get('instance', '')}:{seq}"
            cur = db.execute(
                "INSERT OR IGNORE INTO node_events (key, node, type, ts, payload) VALUES (?, ?, ?, ?, ?)",
                (key, node, typ, ts, payload),
            )
            if cur.rowcount == 0:
                return False
            if typ == HEARTBEAT:
                db.execute(
                    "INSERT INTO nodes (node, last_heartbeat, data) VALUES (?, ?, ?) ON CONFLICT(node) DO UPDATE SET "
                    "last_heartbeat = MAX(last_heartbeat, excluded.last_heartbeat), "
                    "data = CASE WHEN excluded.last_heartbeat >= last_heartbeat THEN excluded.data ELSE data END",
                    (node, ts, orjson.dumps(data).decode()),
                )
            elif typ == ALERT:
                db.execute(
                    "INSERT OR IGNORE INTO alerts (key, node, session, kind, ts, data) VALUES (?, ?, NULL, ?, ?, ?)",
                    (key, node, str(data.get("kind", "")), ts, orjson.dumps(data).decode()),
                )
            return True
        cur = db.execute(
            "INSERT OR IGNORE INTO events (session, seq, node, type, ts, payload) VALUES (?, ?, ?, ?, ?, ?)",
            (session, seq, node, typ, ts, payload),
        )
        labels: dict[str, Any] = ev["labels"]
        run, task = labels.get(self.run_label), labels.get(self.task_label)
        if cur.rowcount == 0:
            db.execute("UPDATE sessions SET duplicates = duplicates + 1 WHERE session = ?", (session,))
            return False
        db.execute(
            "INSERT INTO sessions (session, node, run, task, labels, events, max_seq) VALUES (?, ?, ?, ?, ?, 1, ?) "
            "ON CONFLICT(session) DO UPDATE SET events = events + 1, max_seq = MAX(max_seq, excluded.max_seq)",
            (session, node, run, task, orjson.dumps(labels).decode(), seq),
        )
        if typ == CREATED:
            db.execute("UPDATE sessions SET created_ts = ? WHERE session = ?", (ts, session))
            self._activity(ts, "created")
        elif typ == STEP:
            db.execute("UPDATE sessions SET steps = steps + 1 WHERE session = ?", (session,))
            self._rollup_steps([ev])
        elif typ == REWARD:
            tampering = data.get("tampering")
            db.execute(
                "INSERT OR IGNORE INTO rewards (session, seq, run, task, status, reward, resolved, ts, tampering) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    session,
                    seq,
                    run,
                    task,
                    str(data.get("status", "")),
                    data.get("reward"),
                    int(bool(data.get("resolved"))),
                    ts,
                    len(tampering) if isinstance(tampering, list) else 0,
                ),
            )
            self._activity(ts, "graded")
        elif typ in (CLOSED, FAILED):
            db.execute(
                "UPDATE sessions SET ended_ts = ?, state = ?, end_reason = ? WHERE session = ?",
                (ts, typ, str(data.get("reason", "")), session),
            )
            self._activity(ts, "ended")
        elif typ == ALERT:
            db.execute(
                "INSERT OR IGNORE INTO alerts (key, node, session, kind, ts, data) VALUES (?, ?, ?, ?, ?, ?)",
                (f"{session}:{seq}", node, session, str(data.get("kind", "")), ts, orjson.dumps(data).decode()),
            )
        elif typ == FILES:
            pass
        window = data.get("unused_seq_window")
        if isinstance(window, list) and len(window) == 2 and all(isinstance(x, int) for x in window):
            db.execute("INSERT OR IGNORE INTO seq_windows (session, lo, hi) VALUES (?, ?, ?)", (session, window[0], window[1]))
        return True

    # -- queries --------------------------------------------------------------------------------
    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        with self._lock:
            cur = self._db.execute(sql, args)
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def _reward_stats(self, group: str, where: str = "", args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        rows = self._rows(
            f"SELECT {group} AS name, COUNT(*) AS gradings, SUM(status = 'ok') AS ok, "
            f"SUM(status = 'infra_error') AS infra_errors, "
            f"SUM(status = 'timeout') AS timeouts, SUM(status = 'invalid_task') AS invalid, AVG(reward) AS mean_reward, "
            f"AVG(CASE WHEN reward IS NOT NULL THEN resolved END) AS pass_rate, COUNT(DISTINCT session) AS sessions, "
            f"SUM(tampering > 0) AS tampered, "
            f"SUM(reward IS NOT NULL AND reward <= 0) AS r0, SUM(reward > 0 AND reward <= 0.25) AS r1, "
            f"SUM(reward > 0.25 AND reward <= 0.5) AS r2, SUM(reward > 0.5 AND reward < 1) AS r3, SUM(reward >= 1) AS r4 "
            f"FROM rewards {where} GROUP BY {group} ORDER BY {group}",
            args,
        )
        for r in rows:
            r["distribution"] = {"0": r.pop("r0") or 0, "(0,.25]": r.pop("r1") or 0, "(.25,.5]": r.pop("r2") or 0,
                                 "(.5,1)": r.pop("r3") or 0, "1": r.pop("r4") or 0}  # fmt: skip
        return rows

    def runs(self) -> list[dict[str, Any]]:
        stats = {r["name"]: r for r in self._reward_stats("run")}
        rows = self._rows(
            "SELECT run AS name, COUNT(*) AS sessions_seen, SUM(steps) AS steps, SUM(state = 'open') AS open, "
            "SUM(max_seq - events) AS missing_events, SUM(duplicates) AS duplicates FROM sessions GROUP BY run ORDER BY run"
        )
        with self._lock:
            in_windows = self._window_missing()
            run_of = dict(
                self._db.execute("SELECT session, run FROM sessions WHERE session IN (SELECT session FROM seq_windows)")
            )
        for r in rows:
            r["missing_events"] -= sum(u for session, (u, _) in in_windows.items() if run_of.get(session) == r["name"])
            r.update({k: v for k, v in stats.get(r["name"], {}).items() if k not in ("name", "sessions")})
        return rows

    def tasks(self, run: str | None = None) -> list[dict[str, Any]]:
        if run is None:
            return self._reward_stats("task")
        return self._reward_stats("task", "WHERE run = ?", (run,))

    def nodes(self) -> list[dict[str, Any]]:
        rows = self._rows("SELECT node, last_heartbeat, data FROM nodes ORDER BY node")
        for r in rows:
            r["data"] = orjson.loads(r["data"])
        return rows

    def alerts(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = self._rows("SELECT node, session, kind, ts, data FROM alerts ORDER BY ts DESC LIMIT ?", (limit,))
        for r in rows:
            r["data"] = orjson.loads(r["data"])
        return rows

    def _window_missing(self) -> dict[str, tuple[int, int]]:
        """Per session, (unused, lost) numbers inside the windows restarted daemons declared."""
        missing: dict[str, tuple[int, int]] = {}
        for session, lo, hi in self._db.execute("SELECT session, lo, hi FROM seq_windows").fetchall():
            have, top = self._db.execute(
                "SELECT COUNT(*), COALESCE(MAX(seq), ?) FROM events WHERE session = ? AND seq BETWEEN ? AND ?",
                (lo - 1, session, lo, hi),
            ).fetchone()
            lost = (top - lo + 1) - have  # below the highest that arrived: used, and missing
            unused = hi - top
            was = missing.get(session, (0, 0))
            missing[session] = (was[0] + unused, was[1] + lost)
        return missing

    def integrity(self) -> dict[str, Any]:
        with self._lock:
            events = self._db.execute("SELECT value FROM counters WHERE name = 'events'").fetchone()[0]
            sessions, missing, dups = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(max_seq - events), 0), COALESCE(SUM(duplicates), 0) FROM sessions"
            ).fetchone()
            gap_sessions = dict(self._db.execute("SELECT session, max_seq - events FROM sessions WHERE max_seq > events"))
            in_windows = self._window_missing()
            counters = dict(self._db.execute("SELECT name, value FROM counters").fetchall())
        unused = sum(u for u, _ in in_windows.values())
        lost = sum(lost for _, lost in in_windows.values())
        gaps = sum(1 for s, n in gap_sessions.items() if n > in_windows.get(s, (0, 0))[0])
        return {
            "events": events,
            "sessions": sessions,
            "sessions_with_gaps": gaps,
            "missing_events": missing - unused,
            "crash_window_unused": unused,
            "crash_window_lost": lost,
            "duplicates": dups,
            "duplicates_total": counters.get("duplicates", 0),
            "invalid": counters.get("invalid", 0),
        }

    # -- the dashboard's views (each bounded: SQL aggregates, paged lists) -------------------------
    def activity(self, since: float, step: int = 10) -> list[dict[str, Any]]:
        """Per ``step`` seconds from ``since``: steps, sessions created and ended, gradings."""
        return self._rows(
            "SELECT second / ? * ? AS t, SUM(steps) AS steps, SUM(created) AS created, SUM(ended) AS ended, "
            "SUM(graded) AS graded FROM activity WHERE second >= ? GROUP BY t ORDER BY t",
            (step, step, int(since)),
        )

    def latency(self, since: float) -> dict[str, Any]:
        """Step latency percentiles (ms) since ``since`` (minute resolution), from the buckets:
        interpolated within a bucket, so as exact as the buckets are (LATENCY_BOUNDS)."""
        with self._lock:
            counts = dict(
                self._db.execute(
                    "SELECT bucket, SUM(n) FROM step_latency WHERE minute >= ? GROUP BY bucket", (int(since) // 60 * 60,)
                ).fetchall()
            )
        total = sum(counts.values())
        out: dict[str, Any] = {"steps": total}
        for q in (0.5, 0.9, 0.99):
            out[f"p{round(q * 100)}_ms"] = _percentile(counts, total, q)
        return out

    def curve(self, run: str, points: int = 200, task: str | None = None) -> list[dict[str, Any]]:
        """A run's rewards (or one task's in it) over time in at most ``points`` buckets: mean
        reward, pass rate, gradings, infra errors and tampered gradings per bucket."""
        where, args = ("run = ? AND task = ?", (run, task)) if task is not None else ("run = ?", (run,))
        with self._lock:
            lo, hi = self._db.execute(f"SELECT MIN(ts), MAX(ts) FROM rewards WHERE {where}", args).fetchone()
        if lo is None:
            return []
        width = max((hi - lo) / max(points, 1), 1.0)
        return self._rows(
            "SELECT CAST((ts - ?) / ? AS INTEGER) AS b, MIN(ts) AS t, COUNT(*) AS gradings, AVG(reward) AS mean_reward, "
            "AVG(CASE WHEN reward IS NOT NULL THEN resolved END) AS pass_rate, SUM(status = 'infra_error') AS infra_errors, "
            f"SUM(tampering > 0) AS tampered FROM rewards WHERE {where} GROUP BY b ORDER BY b",
            (lo, width, *args),
        )

    def run_sessions(self, run: str, *, before: float | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """A page of a run's sessions, newest first (``before``: the created_ts the last page ended
        at), by the (run, created_ts) index. A session whose created event never arrived is in the
        run's numbers but in no page."""
        rows = self._rows(
            "SELECT s.session, s.node, s.task, s.created_ts, s.ended_ts, s.state, s.end_reason, s.steps, "
            "(SELECT status FROM rewards r WHERE r.session = s.session ORDER BY r.seq DESC LIMIT 1) AS status, "
            "(SELECT reward FROM rewards r WHERE r.session = s.session ORDER BY r.seq DESC LIMIT 1) AS reward "
            "FROM sessions s WHERE s.run = ? AND s.created_ts < ? ORDER BY s.created_ts DESC LIMIT ?",
            (run, before if before is not None else math.inf, max(1, min(limit, 500))),
        )
        return rows

    def rates(self, now: float, window: float = 60.0) -> dict[str, float]:
        """Per second over the last ``window`` seconds: steps, sessions created and ended, gradings."""
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE(SUM(steps), 0), COALESCE(SUM(created), 0), COALESCE(SUM(ended), 0), COALESCE(SUM(graded), 0) "
                "FROM activity WHERE second >= ? AND second < ?",
                (int(now - window), int(now)),
            ).fetchone()
        return {name: value / window for name, value in zip(("steps", "created", "ended", "graded"), row, strict=True)}

    def window_stats(self, first: int, last: int, width: float) -> list[WindowStats]:
        """Per run, the gradings of windows ``first`` to ``last`` (window i: ts in [i*width, (i+1)*width))."""
        with self._lock:
            rows = self._db.execute(
                "SELECT run, CAST(ts / ? AS INTEGER) AS w, COUNT(*), SUM(status = 'infra_error'), SUM(reward IS NOT NULL), "
                "COALESCE(SUM(reward), 0), SUM(tampering > 0) FROM rewards "
                "WHERE ts >= ? AND ts < ? AND run IS NOT NULL GROUP BY run, w",
                (width, first * width, (last + 1) * width),
            ).fetchall()
        return [WindowStats(*row) for row in rows]

    def run_totals(self, runs: int = 200) -> list[tuple[str, str, int, float, int, int]]:
        """(run, status, gradings, reward sum, rewarded, tampered) of the ``runs`` most recently
        graded runs: counters for Prometheus (rewards only ever add rows)."""
        with self._lock:
            return self._db.execute(
                "SELECT run, status, COUNT(*), COALESCE(SUM(reward), 0), SUM(reward IS NOT NULL), SUM(tampering > 0) "
                "FROM rewards WHERE run IN (SELECT run FROM rewards WHERE run IS NOT NULL GROUP BY run "
                "ORDER BY MAX(ts) DESC LIMIT ?) GROUP BY run, status",
                (runs,),
            ).fetchall()

    def alert_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT kind, COUNT(*) FROM alerts GROUP BY kind").fetchall())

    def timeline(self, session: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT payload FROM events WHERE session = ? ORDER BY seq", (session,)).fetchall()
        return [orjson.loads(r[0]) for r in rows]

    def trajectories(self, run: str) -> Iterator[dict[str, Any]]:
        """One record per session of ``run``: its labels, steps, rewards and end, in order."""
        for s in self._rows("SELECT * FROM sessions WHERE run = ? ORDER BY created_ts, session", (run,)):
            events = self.timeline(s["session"])
            yield {
                "session": s["session"],
                "node": s["node"],
                "run": s["run"],
                "task": s["task"],
                "labels": orjson.loads(s["labels"]),
                "created_ts": s["created_ts"],
                "ended_ts": s["ended_ts"],
                "end": s["state"],
                "end_reason": s["end_reason"],
                "complete": s["max_seq"] == s["events"] and s["state"] != "open",
                "steps": [dict(e["data"], seq=e["seq"], ts=e["ts"]) for e in events if e["type"] == STEP],
                "files": [dict(e["data"], seq=e["seq"], ts=e["ts"]) for e in events if e["type"] == FILES],
                "rewards": [dict(e["data"], seq=e["seq"], ts=e["ts"]) for e in events if e["type"] == REWARD],
            }


def _percentile(counts: dict[int, int], total: int, q: float) -> float | None:
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for bucket in sorted(counts):
        n = counts[bucket]
        if seen + n >= rank:
            upper = LATENCY_BOUNDS[min(bucket, len(LATENCY_BOUNDS) - 1)]
            lower = LATENCY_BOUNDS[bucket - 1] if bucket > 0 else 0.0
            if math.isinf(upper):
                return lower * 1000
            return (lower + (upper - lower) * (rank - seen) / n) * 1000
        seen += n
    return None  # pragma: no cover - the ranks add up to total


def _add_column(db: sqlite3.Connection, table: str, column: str) -> None:
    """Add a column a store made by an earlier version lacks (another aggregator may race us to it)."""
    name = column.split()[0]
    if name in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
        return
    try:
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
    except sqlite3.OperationalError as e:
        if "duplicate column" not in str(e):
            raise
