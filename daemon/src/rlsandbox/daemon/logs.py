"""Structured logs: JSON lines (or a human format for a terminal) with the node, session, pool,
request and trace ids of whatever the line is about, and a level per component.

Fields come from three places, the most specific winning: ``extra={...}`` of the call, the
context of the request being served (:func:`log_context`, set by the API's edge for every call),
and the node-wide fields (:func:`set_node_fields`, the node id).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import logging
import sys
import traceback
from collections.abc import Iterator
from typing import IO, Any

import orjson

FIELDS = ("node", "session", "pool", "container", "request", "trace", "code")
_context: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("rlsandbox_log_context", default={})  # noqa: B039 - never mutated
_node_fields: dict[str, str] = {}


def set_node_fields(**fields: str) -> None:
    """Fields of every line of this process (the node id)."""
    _node_fields.update({k: v for k, v in fields.items() if v})


@contextlib.contextmanager
def log_context(**fields: str) -> Iterator[None]:
    """Fields of every line logged inside the block (and in tasks it starts)."""
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items() if v}})
    try:
        yield
    finally:
        _context.reset(token)


def context_field(name: str) -> str:
    """A field of the current log context ('' if unset): the edge's request and trace ids."""
    return _context.get().get(name, "")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {**_node_fields, **_context.get()}
    for key in FIELDS:
        value = record.__dict__.get(key)
        if value:
            out[key] = value
    extra = record.__dict__.get("fields")
    if isinstance(extra, dict):
        out.update({k: v for k, v in extra.items() if v not in (None, "")})
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601), level, logger, msg, the fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            line["exc"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message [key=value ...]`` for people at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = {k: v for k, v in _fields(record).items() if k != "node"}
        if not fields:
            return text
        head, sep, tail = text.partition("\n")  # the fields go on the message line, before a traceback
        return head + " [" + " ".join(f"{k}={v}" for k, v in fields.items()) + "]" + sep + tail


def parse_levels(spec: str) -> tuple[int, dict[str, int]]:
    """``"INFO"`` or ``"INFO,pool=DEBUG,rlsandbox.daemon.grading=WARNING"``: the root level and
    levels per component (a short name means ``rlsandbox.daemon.<name>``)."""
    root = logging.INFO
    per: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, level = part.rpartition("=")
        value = logging.getLevelName(level.upper())
        if not isinstance(value, int):
            raise ValueError(f"unknown log level {level!r} in {spec!r} (DEBUG, INFO, WARNING, ERROR, CRITICAL)")
        if not name:
            root = value
        else:
            per[name if name.startswith("rlsandbox") else f"rlsandbox.daemon.{name}"] = value
    return root, per


def configure(levels: str = "INFO", fmt: str = "auto", stream: IO[str] | None = None) -> None:
    """Set up the process's logging: ``fmt`` is json, text, or auto (text on a terminal)."""
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "text" if stream.isatty() else "json"
    if fmt not in ("json", "text"):
        raise ValueError(f"log format must be json, text or auto, not {fmt!r}")
    root, per = parse_levels(levels)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logger = logging.getLogger()
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(root)
    for name, level in per.items():
        logging.getLogger(name).setLevel(level)
