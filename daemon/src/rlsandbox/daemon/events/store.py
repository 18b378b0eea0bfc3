"""The aggregator's store: an embedded SQLite database (WAL) or PostgreSQL, written idempotently.

Session events are keyed by (session, seq): an event that arrives twice (redelivery, a replayed
outbox) is counted as a duplicate and changes nothing else. What the events say is kept in plain
tables (sessions, steps, rewards, nodes, alerts) that the queries read; gaps are the sequence
numbers a session has not delivered (its highest seq minus the events it has), except inside a
window a restarted daemon declared (``unused_seq_window``: numbers its earlier life did not
journal as emitted). Numbers are used in order, so inside a window a missing number below one
that arrived was used and lost (``crash_window_lost``, counted in ``missing_events`` too); the
missing numbers above the highest that arrived were never used, or used in the journal's last
moment before the crash (``crash_window_unused``).
Several aggregator processes may share one database: a SQLite file (which serialises their
writes) on one machine, PostgreSQL (``postgresql://`` URL, events/database.py) for a cluster. In
PostgreSQL the bulk path takes its row locks in one order (sessions, then seconds, minutes and
counters, each sorted), and a transaction that still meets a deadlock is tried again.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
from rlsandbox.daemon.errors import Unavailable
from rlsandbox.daemon.events.anomalies import WindowStats
from rlsandbox.daemon.events.database import Database, open_database
from rlsandbox.daemon.events.model import ALERT, CLOSED, CREATED, FAILED, FILES, HEARTBEAT, MAX_SEQ, REWARD, STEP, decode_all

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
-- what happened, and per minute how long steps took (counts per latency bucket, LATENCY_BOUNDS).
CREATE TABLE IF NOT EXISTS activity (second INTEGER PRIMARY KEY, steps INTEGER NOT NULL DEFAULT 0,
    created INTEGER NOT NULL DEFAULT 0, ended INTEGER NOT NULL DEFAULT 0, graded INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS step_latency (minute INTEGER NOT NULL, bucket INTEGER NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (minute, bucket)) WITHOUT ROWID;
"""
# Upper bounds (seconds) of the step latency buckets; the last one is open.
LATENCY_BOUNDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, math.inf)

log = logging.getLogger(__name__)
RUN_LABEL = "run"
TASK_LABEL = "task"
BUCKETS = (0.0, 0.25, 0.5, 0.75, 1.0)
_ATTEMPTS = 5  # tries of a write transaction that meets a deadlock (PostgreSQL, several aggregators)


class Store:
    def __init__(
        self, where: str | Path, *, run_label: str = RUN_LABEL, task_label: str = TASK_LABEL, create: bool = True
    ) -> None:
        """``where``: a SQLite file or a ``postgresql://`` URL. ``create=False``: a SQLite file
        must exist already (readers such as ``rlsandbox stats``)."""
        self.run_label = run_label
        self.task_label = task_label
        self._lock = threading.Lock()
        self.retries = 0  # write transactions tried again after a deadlock
        self._db = open_database(where, create=create)
        self.where = self._db.where  # for logs: no password
        try:
            self._db.create_schema(SCHEMA, {"rewards": ["tampering INTEGER NOT NULL DEFAULT 0"]})  # stores made before it
            # The events counted once (a store made before the counter), then kept by apply().
            self._db.execute(
                "INSERT INTO counters (name, value) SELECT 'events', COUNT(*) FROM events WHERE true ON CONFLICT DO NOTHING"
            )
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writes ---------------------------------------------------------------------------------
    def apply(self, payloads: Iterable[bytes]) -> tuple[int, int, int]:
        """Write a batch in one transaction; returns (new events, duplicates, invalid).

        An event the database refuses (``bad_data``: none is known; this is the guard) never
        stops the stream at it: the batch is written again message by message and event by
        event, and only what is refused alone is counted invalid, with an error in the log.
        """
        payloads = list(payloads)
        try:
            return self._apply(payloads)
        except self._db.bad_data as e:
            events: list[bytes] = []
            for payload in payloads:
                try:
                    decoded, batch = decode_all(payload)
                except ValueError:  # counted invalid when applied alone
                    decoded, batch = [], False
                events += [orjson.dumps(ev) for ev in decoded] if batch else [payload]
            if len(events) == 1:
                log.error("store: an event the database refuses was skipped (%s: %s)", type(e).__name__, e)
                with self._lock, self._db.transaction():
                    _Batch(self.run_label, self.task_label).write(self._db, 1)
                return 0, 0, 1
            totals = [self.apply([event]) for event in events]
            return sum(t[0] for t in totals), sum(t[1] for t in totals), sum(t[2] for t in totals)

    def _apply(self, payloads: list[bytes]) -> tuple[int, int, int]:
        """Write a batch in one transaction; returns (new events, duplicates, invalid).

        The events are inserted first, all at once (in (session, seq) order); only when that meets
        an event stored already is it undone to the savepoint and done event by event, to learn
        which ones are new. What the new events say is then summed per row (a session, a second, a
        minute's latency bucket, a counter) and written once per row, table by table in one fixed
        order and each table's rows sorted: two aggregators writing one PostgreSQL database take
        their row locks in the same order, so they wait for each other and never deadlock on the
        store's own rows (a deadlock is still tried again, ``_ATTEMPTS`` times).
        """
        session_events: list[tuple[dict[str, Any], bytes]] = []
        node_events: list[tuple[dict[str, Any], bytes]] = []
        bad = 0
        for payload in payloads:
            try:
                events, batch = decode_all(payload)
            except ValueError:
                bad += 1
                continue
            # Each event of a batch (even of one) is stored as its own JSON.
            for ev in events:
                (session_events if ev["session"] else node_events).append((ev, orjson.dumps(ev) if batch else payload))
        session_events.sort(key=lambda e: (e[0]["session"], e[0]["seq"]))
        node_events.sort(key=lambda e: _node_key(e[0]))
        with self._lock:
            try:
                self._db.reconnect()
                for attempt in range(_ATTEMPTS):
                    try:
                        with self._db.transaction():
                            new, dup = self._write(session_events, node_events, bad)
                        break
                    except self._db.retryable:  # PostgreSQL: a deadlock with another aggregator
                        self.retries += 1
                        if attempt == _ATTEMPTS - 1:
                            raise
            except self._db.lost as e:  # nothing of the batch was committed: the caller keeps it
                raise Unavailable(f"the aggregator database {self.where} does not answer: {e}".strip()) from e
        return new, dup, bad

    def _write(
        self, session_events: list[tuple[dict[str, Any], bytes]], node_events: list[tuple[dict[str, Any], bytes]], bad: int
    ) -> tuple[int, int]:
        """One transaction's writes; returns (new events, duplicates)."""
        db = self._db
        rows = [(ev["session"], ev["seq"], ev["node"], ev["type"], float(ev["ts"]), p) for ev, p in session_events]
        insert = "INSERT INTO events (session, seq, node, type, ts, payload) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
        db.execute("SAVEPOINT events")
        if db.executemany(insert, rows) == len(rows):
            fresh = [True] * len(rows)
        else:  # some were there already: which ones
            db.execute("ROLLBACK TO SAVEPOINT events")
            fresh = [db.execute(insert, row).rowcount == 1 for row in rows]
        db.execute("RELEASE SAVEPOINT events")
        batch = _Batch(self.run_label, self.task_label)
        for (ev, _), is_new in zip(session_events, fresh, strict=True):
            batch.session_event(ev, is_new)
        for ev, payload in node_events:
            cur = db.execute(
                "INSERT INTO node_events (key, node, type, ts, payload) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (_node_key(ev), ev["node"], ev["type"], float(ev["ts"]), payload),
            )
            batch.node_event(ev, cur.rowcount == 1)
        batch.write(db, bad)
        return batch.new, batch.duplicates

    # -- queries --------------------------------------------------------------------------------
    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        with self._lock:
            cur = self._db.execute(sql, args)
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def _reward_stats(self, group: str, where: str = "", args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        rows = self._rows(
            f"SELECT {group} AS name, COUNT(*) AS gradings, COUNT(*) FILTER (WHERE status = 'ok') AS ok, "
            "COUNT(*) FILTER (WHERE status = 'infra_error') AS infra_errors, "
            "COUNT(*) FILTER (WHERE status = 'timeout') AS timeouts, "
            "COUNT(*) FILTER (WHERE status = 'invalid_task') AS invalid, AVG(reward) AS mean_reward, "
            "AVG(CASE WHEN reward IS NOT NULL THEN resolved END) AS pass_rate, COUNT(DISTINCT session) AS sessions, "
            "COUNT(*) FILTER (WHERE tampering > 0) AS tampered, "
            "COUNT(*) FILTER (WHERE reward IS NOT NULL AND reward <= 0) AS r0, "
            "COUNT(*) FILTER (WHERE reward > 0 AND reward <= 0.25) AS r1, "
            "COUNT(*) FILTER (WHERE reward > 0.25 AND reward <= 0.5) AS r2, "
            "COUNT(*) FILTER (WHERE reward > 0.5 AND reward < 1) AS r3, COUNT(*) FILTER (WHERE reward >= 1) AS r4 "
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
            "SELECT run AS name, COUNT(*) AS sessions_seen, SUM(steps) AS steps, COUNT(*) FILTER (WHERE state = 'open') AS open, "
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
            "SELECT CAST(FLOOR((ts - ?) / ?) AS BIGINT) AS b, MIN(ts) AS t, COUNT(*) AS gradings, AVG(reward) AS mean_reward, "
            "AVG(CASE WHEN reward IS NOT NULL THEN resolved END) AS pass_rate, "
            "COUNT(*) FILTER (WHERE status = 'infra_error') AS infra_errors, "
            f"COUNT(*) FILTER (WHERE tampering > 0) AS tampered FROM rewards WHERE {where} GROUP BY b ORDER BY b",
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
                "SELECT run, CAST(FLOOR(ts / ?) AS BIGINT) AS w, COUNT(*), COUNT(*) FILTER (WHERE status = 'infra_error'), "
                "COUNT(*) FILTER (WHERE reward IS NOT NULL), "
                "COALESCE(SUM(reward), 0), COUNT(*) FILTER (WHERE tampering > 0) FROM rewards "
                "WHERE ts >= ? AND ts < ? AND run IS NOT NULL GROUP BY run, w",
                (width, first * width, (last + 1) * width),
            ).fetchall()
        return [WindowStats(*row) for row in rows]

    def run_totals(self, runs: int = 200) -> list[tuple[str, str, int, float, int, int]]:
        """(run, status, gradings, reward sum, rewarded, tampered) of the ``runs`` most recently
        graded runs: counters for Prometheus (rewards only ever add rows)."""
        with self._lock:
            return self._db.execute(
                "SELECT run, status, COUNT(*), COALESCE(SUM(reward), 0), COUNT(*) FILTER (WHERE reward IS NOT NULL), "
                "COUNT(*) FILTER (WHERE tampering > 0) "
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


def _text(value: Any) -> str | None:
    """A label as the run and task columns hold it: text (a label that is not is kept as its JSON)."""
    return value if value is None or isinstance(value, str) else orjson.dumps(value).decode()


def _number(value: Any) -> float | None:
    """A reward as the rewards table holds it: a finite number, or none."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _node_key(ev: dict[str, Any]) -> str:
    """A node event's identity: node, the daemon's instance (one life of it) and number."""
    return f"{ev['node']}/{ev['data'].get('instance', '')}:{ev['seq']}"


class _Batch:
    """What one transaction's events change, summed per row, then written in one fixed order."""

    def __init__(self, run_label: str, task_label: str) -> None:
        self.run_label = run_label
        self.task_label = task_label
        self.new = self.duplicates = self.stored = 0  # stored: new session events (the events table)
        # session -> [node, run, task, labels, events, max_seq, steps, duplicates, created_ts, end (ts, state, reason)]
        self.sessions: dict[str, list[Any]] = {}
        self.rewards: list[tuple[Any, ...]] = []
        self.alerts: list[tuple[Any, ...]] = []
        self.windows: list[tuple[str, int, int]] = []
        self.heartbeats: dict[str, tuple[float, str]] = {}
        self.activity: dict[int, list[int]] = {}  # second -> [steps, created, ended, graded]
        self.latency: dict[tuple[int, int], int] = {}  # (minute, bucket) -> steps

    def _second(self, ts: float, column: int) -> None:
        self.activity.setdefault(int(ts), [0, 0, 0, 0])[column] += 1

    def session_event(self, ev: dict[str, Any], new: bool) -> None:
        session, seq, typ, ts = ev["session"], ev["seq"], ev["type"], float(ev["ts"])
        row = self.sessions.get(session)
        if row is None:
            labels: dict[str, Any] = ev["labels"]
            row = [ev["node"], _text(labels.get(self.run_label)), _text(labels.get(self.task_label)),
                   orjson.dumps(labels).decode(), 0, 0, 0, 0, None, None]  # fmt: skip
            self.sessions[session] = row
        if not new:
            row[7] += 1
            self.duplicates += 1
            return
        self.new += 1
        self.stored += 1
        row[4] += 1
        row[5] = max(row[5], seq)
        data: dict[str, Any] = ev["data"]
        if typ == STEP:
            row[6] += 1
            self._second(ts, 0)
            duration = data.get("duration")
            if isinstance(duration, int | float):
                key = (int(ts) // 60 * 60, bisect.bisect_left(LATENCY_BOUNDS, duration))
                self.latency[key] = self.latency.get(key, 0) + 1
        elif typ == CREATED:
            row[8] = ts
            self._second(ts, 1)
        elif typ in (CLOSED, FAILED):
            row[9] = (ts, typ, str(data.get("reason", "")))  # the last end of the batch (events come in seq order)
            self._second(ts, 2)
        elif typ == REWARD:
            tampering = data.get("tampering")
            self.rewards.append(
                (session, seq, row[1], row[2], str(data.get("status", "")), _number(data.get("reward")),
                 int(bool(data.get("resolved"))), ts, len(tampering) if isinstance(tampering, list) else 0)
            )  # fmt: skip
            self._second(ts, 3)
        elif typ == ALERT:
            self.alerts.append(
                (f"{session}:{seq}", ev["node"], session, str(data.get("kind", "")), ts, orjson.dumps(data).decode())
            )
        window = data.get("unused_seq_window")
        if isinstance(window, list) and len(window) == 2 and all(isinstance(x, int) and 0 <= x < MAX_SEQ for x in window):
            self.windows.append((session, window[0], window[1]))

    def node_event(self, ev: dict[str, Any], new: bool) -> None:
        if not new:
            self.duplicates += 1
            return
        self.new += 1
        typ, ts, data = ev["type"], float(ev["ts"]), ev["data"]
        if typ == HEARTBEAT:
            was = self.heartbeats.get(ev["node"])
            if was is None or ts >= was[0]:
                self.heartbeats[ev["node"]] = (ts, orjson.dumps(data).decode())
        elif typ == ALERT:
            self.alerts.append((_node_key(ev), ev["node"], None, str(data.get("kind", "")), ts, orjson.dumps(data).decode()))

    def write(self, db: Database, invalid: int) -> None:
        """Table by table in one order, each table's rows sorted (the lock order of every writer)."""
        db.executemany(
            "INSERT INTO sessions (session, node, run, task, labels, events, max_seq, steps, duplicates, created_ts, "
            "ended_ts, state, end_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(session) DO UPDATE SET events = sessions.events + excluded.events, "
            "max_seq = GREATEST(sessions.max_seq, excluded.max_seq), steps = sessions.steps + excluded.steps, "
            "duplicates = sessions.duplicates + excluded.duplicates, "
            "created_ts = COALESCE(excluded.created_ts, sessions.created_ts), "
            "state = CASE WHEN excluded.ended_ts IS NULL THEN sessions.state ELSE excluded.state END, "
            "end_reason = CASE WHEN excluded.ended_ts IS NULL THEN sessions.end_reason ELSE excluded.end_reason END, "
            "ended_ts = COALESCE(excluded.ended_ts, sessions.ended_ts)",
            [(s, *r[:9], *(r[9] or (None, "open", None))) for s, r in sorted(self.sessions.items())],
        )
        db.executemany(
            "INSERT INTO rewards (session, seq, run, task, status, reward, resolved, ts, tampering) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            self.rewards,
        )
        db.executemany(
            "INSERT INTO alerts (key, node, session, kind, ts, data) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            sorted(self.alerts),
        )
        db.executemany("INSERT INTO seq_windows (session, lo, hi) VALUES (?, ?, ?) ON CONFLICT DO NOTHING", sorted(self.windows))
        db.executemany(
            "INSERT INTO nodes (node, last_heartbeat, data) VALUES (?, ?, ?) ON CONFLICT(node) DO UPDATE SET "
            "data = CASE WHEN excluded.last_heartbeat >= nodes.last_heartbeat THEN excluded.data ELSE nodes.data END, "
            "last_heartbeat = GREATEST(nodes.last_heartbeat, excluded.last_heartbeat)",
            [(node, ts, data) for node, (ts, data) in sorted(self.heartbeats.items())],
        )
        db.executemany(
            "INSERT INTO activity (second, steps, created, ended, graded) VALUES (?, ?, ?, ?, ?) ON CONFLICT(second) "
            "DO UPDATE SET steps = activity.steps + excluded.steps, created = activity.created + excluded.created, "
            "ended = activity.ended + excluded.ended, graded = activity.graded + excluded.graded",
            [(second, *counts) for second, counts in sorted(self.activity.items())],
        )
        db.executemany(
            "INSERT INTO step_latency (minute, bucket, n) VALUES (?, ?, ?) "
            "ON CONFLICT(minute, bucket) DO UPDATE SET n = step_latency.n + excluded.n",
            [(m, b, n) for (m, b), n in sorted(self.latency.items())],
        )
        counters = {"duplicates": self.duplicates, "events": self.stored, "invalid": invalid}  # events: what integrity() reports
        db.executemany(
            "INSERT INTO counters (name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = counters.value + excluded.value",
            [(name, n) for name, n in sorted(counters.items()) if n > 0],
        )


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
