"""The event model: versioned JSON events (orjson), their subjects and the JetStream stream.

Every event is one JSON object (docs/events.md)::

    {"v": 1, "type": "step", "node": "n1", "session": "n1-5f2c...", "seq": 4,
     "ts": 1764700000.123, "labels": {"run": "r7", "task": "calc-1"}, "data": {...}}

``seq`` counts a session's events from 1 (``session.created``) without holes, so the aggregator
can tell a lost event (a gap) from a repeated one (a duplicate). Node events (heartbeats, node
alerts) carry ``session = ""`` and count per daemon instance. The JetStream message id
(``Nats-Msg-Id``) is ``<session>:<seq>`` (``<node>/<instance>:<seq>`` for node events), so a
republished event is dropped by the stream's duplicate window, and again by the aggregator's
primary key if it arrives later than that.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

VERSION = 1
SUBJECT_ROOT = "rlsandbox.v1"
STREAM = "RLSANDBOX_EVENTS"
STREAM_SUBJECTS = [f"{SUBJECT_ROOT}.>"]
DUPLICATE_WINDOW = 20 * 60.0  # seconds: longer than any outage the outbox is sized for
CONSUMER = "rlsandbox-aggregators"  # the durable consumer, and the queue group of the aggregators

# Session event types (subject rlsandbox.v1.<node>.session.<session>.<type>).
CREATED = "created"
STEP = "step"
FILES = "files"
REWARD = "reward"
CLOSED = "closed"
FAILED = "failed"
ALERT = "alert"
ADOPTED = "adopted"  # a restarted daemon took the session over again
# Node event types (subject rlsandbox.v1.<node>.node.<type>).
HEARTBEAT = "heartbeat"
# Several step events in one message (subject rlsandbox.v1.<node>.steps).
BATCH = "batch"

SESSION_TYPES = frozenset({CREATED, STEP, FILES, REWARD, CLOSED, FAILED, ALERT, ADOPTED})
NODE_TYPES = frozenset({HEARTBEAT, ALERT})

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def token(value: str) -> str:
    """A subject token: NATS subjects split on '.', and '*', '>' and spaces are not allowed."""
    return _UNSAFE.sub("_", value) or "_"


@dataclass(slots=True)
class Event:
    type: str
    node: str
    session: str
    seq: int
    data: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)
    instance: str = ""  # daemon instance, for node events' message ids

    @property
    def subject(self) -> str:
        if self.session:
            return f"{SUBJECT_ROOT}.{token(self.node)}.session.{token(self.session)}.{self.type}"
        return f"{SUBJECT_ROOT}.{token(self.node)}.node.{self.type}"

    @property
    def msg_id(self) -> str:
        if self.session:
            return f"{self.session}:{self.seq}"
        return f"{self.node}/{self.instance}:{self.seq}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": VERSION,
            "type": self.type,
            "node": self.node,
            "session": self.session,
            "seq": self.seq,
            "ts": self.ts,
            "labels": self.labels,
            "data": self.data,
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())


def steps_subject(node: str) -> str:
    """Where batches of step events go (the other session events keep their own subjects)."""
    return f"{SUBJECT_ROOT}.{token(node)}.steps"


def batch_payload(node: str, events: list[Event]) -> bytes:
    """Several step events in one message: ``{"v": 1, "type": "batch", "node": ..., "events": [...]}``."""
    return orjson.dumps({"v": VERSION, "type": BATCH, "node": node, "events": [e.to_dict() for e in events]})


def _check(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("v") != VERSION:
        raise ValueError(f"not a v{VERSION} rlsandbox event")
    for key, kind in (("type", str), ("node", str), ("session", str), ("seq", int), ("ts", float | int)):
        if not isinstance(doc.get(key), kind):
            raise ValueError(f"event field {key!r} missing or of the wrong type")
    if not isinstance(doc.get("data"), dict) or not isinstance(doc.get("labels"), dict):
        raise ValueError("event data and labels must be objects")
    return doc


def decode(payload: bytes) -> dict[str, Any]:
    """Parse and check one event; raises ValueError on anything that is not a v1 event."""
    return _check(orjson.loads(payload))


def decode_all(payload: bytes) -> tuple[list[dict[str, Any]], bool]:
    """The events of one message, and whether it was a batch (its events checked one by one)."""
    doc = orjson.loads(payload)
    if isinstance(doc, dict) and doc.get("type") == BATCH and doc.get("v") == VERSION and isinstance(doc.get("events"), list):
        return [_check(e) for e in doc["events"]], True
    return [_check(doc)], False
