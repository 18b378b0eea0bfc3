"""The aggregator's database connection: SQLite (a file, the embedded single-node default) or
PostgreSQL (a ``postgresql://`` URL, for clusters where several aggregators write one database).

The store writes its SQL once, in the subset both understand (``?`` parameters, ``ON CONFLICT``,
``COUNT(*) FILTER (WHERE ...)``, ``GREATEST(a, b)``, ``CAST(FLOOR(x) AS BIGINT)``); each
connection translates what its engine spells differently, once per statement text. PostgreSQL's
exact numbers (``SUM`` of integers, ``AVG``) come back as Python ``int`` or ``float``, as
SQLite's do, never as ``Decimal``.

PostgreSQL is reached with psycopg 3 (``pip install 'rlsandbox-daemon[postgres]'``); a password
comes the libpq ways (``PGPASSWORD``, ``PGPASSFILE``/``~/.pgpass``, or in the URL), and never
appears in logs (``where``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
from rlsandbox.daemon.errors import FailedPrecondition, InvalidArgument
from rlsandbox.daemon.storage import open_wal

URL_SCHEMES = ("postgresql://", "postgres://")
# Any constant: aggregators creating the schema at the same moment take turns on it.
_SCHEMA_LOCK = 0x726C73616E64


def is_url(where: str | Path) -> bool:
    return isinstance(where, str) and where.startswith(URL_SCHEMES)


def open_database(where: str | Path, *, create: bool = True) -> Database:
    """A file path opens SQLite; a ``postgresql://`` URL opens PostgreSQL. ``create=False``: the
    SQLite file must exist (a reader must not create an empty store by a typo)."""
    if is_url(where):
        return Postgres(str(where))
    path = Path(where)
    if not create and not path.exists():
        raise InvalidArgument(
            f"no aggregator database at {path}; pass --db (the aggregator's --db: a file or a postgresql:// URL)"
        )
    return Sqlite(path)


class Database:
    """One connection, used by one thread at a time (the store holds a lock around it)."""

    where: str
    retryable: tuple[type[BaseException], ...] = ()  # errors after which a write transaction is tried again
    lost: tuple[type[BaseException], ...] = ()  # errors that mean the server is gone (reconnect on the next use)
    # Errors that mean these rows cannot be stored (a value out of the database's range, say),
    # whatever is tried again: the store isolates the event instead of stopping at it.
    bad_data: tuple[type[BaseException], ...] = (OverflowError, TypeError, ValueError)

    def sql(self, text: str) -> str:
        return text

    def execute(self, text: str, args: Sequence[Any] = ()) -> Any:
        raise NotImplementedError

    def executemany(self, text: str, rows: Sequence[Sequence[Any]]) -> int:
        """Runs ``text`` for each row; returns the rows it changed in all."""
        raise NotImplementedError

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """A write transaction: committed at the end of the block, rolled back on an error."""
        raise NotImplementedError

    def create_schema(self, script: str, added_columns: dict[str, list[str]]) -> None:
        """The tables of ``script`` and the columns stores of earlier versions lack."""
        raise NotImplementedError

    def reconnect(self) -> None:
        """After a ``lost`` error: a working connection again, or the error again."""

    def close(self) -> None:
        raise NotImplementedError


class Sqlite(Database):
    bad_data = (*Database.bad_data, sqlite3.DataError, sqlite3.IntegrityError, sqlite3.InterfaceError)

    def __init__(self, path: Path) -> None:
        self.where = str(path)
        with open_wal(path, timeout=60) as db:
            db.execute("PRAGMA busy_timeout=60000")
            try:
                db.execute("SELECT FLOOR(1.5)")
            except sqlite3.OperationalError:  # an SQLite built without its math functions
                db.create_function("FLOOR", 1, math.floor, deterministic=True)
        self._db = db

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one per store, the statements are a fixed set
    def sql(self, text: str) -> str:
        return text.replace("GREATEST(", "MAX(")  # SQLite's scalar MAX of several arguments

    def execute(self, text: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self._db.execute(self.sql(text), args)

    def executemany(self, text: str, rows: Sequence[Sequence[Any]]) -> int:
        return self._db.executemany(self.sql(text), rows).rowcount

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")  # take the write lock first: no deadlock between aggregators
            yield

    def create_schema(self, script: str, added_columns: dict[str, list[str]]) -> None:
        self._db.executescript(script)
        for table, columns in added_columns.items():
            have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for column in columns:
                if column.split()[0] in have:
                    continue
                try:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
                except sqlite3.OperationalError as e:  # another aggregator raced us to it
                    if "duplicate column" not in str(e):
                        raise

    def close(self) -> None:
        self._db.close()


_TYPES = ((re.compile(r"\bREAL\b"), "DOUBLE PRECISION"), (re.compile(r"\bINTEGER\b"), "BIGINT"),
          (re.compile(r"\bBLOB\b"), "BYTEA"), (re.compile(r"\s+WITHOUT ROWID"), ""))  # fmt: skip


# Tables whose rows are counters updated by every batch: room left in each page lets PostgreSQL
# update a row in place (a HOT update) instead of writing it anew with new entries in every index.
_UPDATED_IN_PLACE = ("sessions", "activity", "step_latency", "counters", "nodes")
_VALUES = re.compile(r"INSERT INTO (\w+) \(([\w, ]+)\) VALUES \(\?(?:, \?)*\)(.*)", re.S)
# A row's field ``{}`` of the JSON document as its column's type.
_FIELD = {"bigint": "(r->>{})::bigint", "double precision": "(r->>{})::double precision", "text": "r->>{}",
          "bytea": "convert_to(r->>{}, 'UTF8')"}  # fmt: skip


def _no_nul(row: Sequence[Any]) -> Sequence[Any]:
    """PostgreSQL's text cannot hold NUL, which a label may carry: it becomes U+FFFD (a visible
    mark) instead of an error that would stop the aggregator at that event for ever. Payloads keep
    it (JSON escapes it)."""
    if not any(isinstance(v, str) and "\0" in v for v in row):
        return row
    return [v.replace("\0", "\ufffd") if isinstance(v, str) else v for v in row]


class Postgres(Database):
    def __init__(self, url: str) -> None:
        try:
            import psycopg
            from psycopg.adapt import Loader
        except ImportError as e:
            raise FailedPrecondition("a postgresql:// database needs psycopg: pip install 'rlsandbox-daemon[postgres]'") from e

        class ExactNumber(Loader):
            """numeric as int when whole (SUM of integers) and float otherwise (AVG), as SQLite gives them."""

            def load(self, data: Any) -> int | float:
                text = bytes(data)
                return float(text) if b"." in text or b"N" in text else int(text)

        self._url = url
        self._writing = False
        self._connect = psycopg.connect
        self._loader = ExactNumber
        parts = urlsplit(url)
        host = parts.hostname or ""
        self.where = urlunsplit(
            parts._replace(netloc=f"{parts.username or ''}@{host}" + (f":{parts.port}" if parts.port else ""))
        )
        self.retryable = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
        self.lost = (psycopg.OperationalError, psycopg.InterfaceError)
        self.bad_data = (*Database.bad_data, psycopg.DataError, psycopg.IntegrityError)
        try:
            self._db = self._open()
        except psycopg.OperationalError as e:
            raise FailedPrecondition(f"cannot connect to the aggregator database {self.where}: {e}".strip()) from e

    def _open(self) -> Any:
        db = self._connect(self._url, autocommit=True, connect_timeout=10, application_name="rlsandbox-aggregator")
        db.adapters.register_loader("numeric", self._loader)
        return db

    def reconnect(self) -> None:
        """A new connection if the server went away (restarted, failed over); raises ``lost``
        while it does not answer."""
        if self._db.closed or self._db.broken:
            self._db.close()
            self._db = self._open()

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one per store, the statements are a fixed set
    def sql(self, text: str) -> str:
        return text.replace("%", "%%").replace("?", "%s")

    def execute(self, text: str, args: Sequence[Any] = ()) -> Any:
        if not self._writing and (self._db.closed or self._db.broken):  # a read after the server came back
            self.reconnect()
        return self._db.execute(self.sql(text), _no_nul(args))  # type: ignore[arg-type]  # our own statements

    def executemany(self, text: str, rows: Sequence[Sequence[Any]]) -> int:
        """An ``INSERT ... VALUES (?, ...)`` of many rows is one statement with the rows as one JSON
        parameter, taken apart by the server (``jsonb_array_elements``) in their order. Measured
        per row on this machine: a pipeline of one statement per row costs the client ~20 us, arrays
        (``unnest``) ~17 us for the values' conversion, JSON ~1 us (orjson)."""
        if not rows:
            return 0
        values = _VALUES.match(text)
        if values is None or len(rows) == 1:
            with self._db.cursor() as cur:
                cur.executemany(self.sql(text), [_no_nul(row) for row in rows])  # type: ignore[arg-type]  # pipelined
                return cur.rowcount
        table, names, rest = values.group(1), [c.strip() for c in values.group(2).split(",")], values.group(3)
        types = self._column_types(table)
        blobs = [i for i, name in enumerate(names) if types[name] == "bytea"]
        if blobs:  # our payloads are JSON text (UTF-8) already
            rows = [[v.decode() if i in blobs and v is not None else v for i, v in enumerate(row)] for row in rows]
        document = orjson.dumps(rows)
        if b"\\u0000" in document:  # a NUL somewhere (or the text of its escape): see _no_nul
            document = orjson.dumps([_no_nul(row) for row in rows])
        fields = ", ".join(_FIELD[types[name]].format(i) for i, name in enumerate(names))
        source = "jsonb_array_elements(%s::jsonb) AS e(r)"  # parsed once per row (json would parse it per field)
        statement = f"INSERT INTO {table} ({values.group(2)}) SELECT {fields} FROM {source}{self.sql(rest)}"
        return self._db.execute(statement, (document.decode(),)).rowcount  # type: ignore[call-overload]  # our own statement

    @functools.lru_cache(maxsize=64)  # noqa: B019 - one per store, a fixed set of tables
    def _column_types(self, table: str) -> dict[str, str]:
        rows = self._db.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = %s AND table_schema = current_schema()",
            (table,),
        ).fetchall()
        return dict(rows)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        self._writing = True  # a connection lost inside fails the transaction: never go on in a new one
        try:
            with self._db.transaction():
                yield
        finally:
            self._writing = False

    def create_schema(self, script: str, added_columns: dict[str, list[str]]) -> None:
        for pattern, replacement in _TYPES:
            script = pattern.sub(replacement, script)
        with self._db.transaction():
            self._db.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            for statement in script.split(";"):
                if statement.strip():
                    self._db.execute(statement)  # type: ignore[call-overload]  # the schema above
            for table in _UPDATED_IN_PLACE:
                self._db.execute(f"ALTER TABLE {table} SET (fillfactor = 70)")  # type: ignore[call-overload]
            for table, columns in added_columns.items():
                for column in columns:
                    for pattern, replacement in _TYPES:
                        column = pattern.sub(replacement, column)
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column}")  # type: ignore[call-overload]

    def close(self) -> None:
        self._db.close()
