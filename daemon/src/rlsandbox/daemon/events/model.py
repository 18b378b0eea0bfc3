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

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Event:
        """An event decoded by ``decode``/``decode_all`` (node events keep their instance)."""
        data = dict(doc["data"])
        return cls(
            doc["type"], doc["node"], doc["session"], doc["seq"], data, dict(doc["labels"]), doc["ts"], data.get("instance", "")
        )

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

    def to_json(self, limit: int = 0) -> bytes:
        """The event as JSON; with ``limit``, at most that many bytes: what does not fit is cut."""
        payload = orjson.dumps(self.to_dict())
        if limit and len(payload) > limit:
            return orjson.dumps(self.fitted(len(payload), limit).to_dict())
        return payload

    def fitted(self, size: int, limit: int) -> Event:
        """This event with its large parts cut to fit ``limit`` bytes, and a note saying so
        (``data.cut``: the original size and what was cut). Labels are bounded at the API."""
        budget = max(limit // 4, 256)
        data: dict[str, Any] = {}
        cut: list[str] = []
        for key, value in self.data.items():
            encoded = orjson.dumps(value)
            if len(encoded) > budget:
                cut.append(key)
                data[key] = f"<cut: {len(encoded)} bytes>"
            else:
                data[key] = value
        data["cut"] = {"original_bytes": size, "fields": cut}
        fitted = Event(self.type, self.node, self.session, self.seq, data, dict(self.labels), self.ts, self.instance)
        if len(orjson.dumps(fitted.to_dict())) > limit:  # still too big: only the identity and the note
            fitted.data = {"cut": {"original_bytes": size, "fields": sorted(self.data)}}
        return fitted


def steps_subject(node: str) -> str:
    """Where batches of step events go (the other session events keep their own subjects)."""
    return f"{SUBJECT_ROOT}.{token(node)}.steps"


def batch_payload(node: str, events: list[Event]) -> bytes:
    """Several step events in one message: ``{"v": 1, "type": "batch", "node": ..., "events": [...]}``."""
    return batch_of(node, [e.to_json() for e in events])


def batch_of(node: str, encoded: list[bytes]) -> bytes:
    """A batch message from events already encoded (each serialized once, on the hot path)."""
    head = b'{"v":%d,"type":"%s","node":%s,"events":[' % (VERSION, BATCH.encode(), orjson.dumps(node))
    return head + b",".join(encoded) + b"]}"


# What a store can hold whatever its database: numbers within 2**53 (JSON's exact integers, and
# far inside SQLite's and PostgreSQL's 64 bits), times within the years 1970 to 5138.
MAX_SEQ = 2**53
MAX_TS = 1e11


def _check(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("v") != VERSION:
        raise ValueError(f"not a v{VERSION} rlsandbox event")
    for key, kind in (("type", str), ("node", str), ("session", str), ("seq", int), ("ts", float | int)):
        value = doc.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"event field {key!r} missing or of the wrong type")
    if not 0 <= doc["seq"] < MAX_SEQ or not 0 <= doc["ts"] < MAX_TS:
        raise ValueError("event seq or ts out of range")
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
