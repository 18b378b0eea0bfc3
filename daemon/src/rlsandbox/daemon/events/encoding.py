"""Events -> NATS messages: runs of step events batched, every message within the size limit.

No message is larger than ``limit`` (NATS's default max_payload is 1 MiB; a server that accepts
less lowers it at connect): an event that would be larger is cut to fit, with a note
(``Event.fitted``). Pure: no I/O, so the rules are tested without a server.
"""

from __future__ import annotations

import logging

import orjson
from rlsandbox.daemon.events.model import STEP, Event, batch_of, decode_all, steps_subject

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 << 10
BATCH_OVERHEAD = 256  # the batch envelope around step events
Record = tuple[str, str, bytes, int]  # (subject, message id, payload, events in it)


class Encoder:
    """Args: node_id, instance: the daemon (part of batch message ids); step_batch: step events
    per batch message (1: every step on its own session subject)."""

    def __init__(self, node_id: str, instance: str, step_batch: int = 256) -> None:
        self.node_id = node_id
        self.instance = instance
        self.step_batch = step_batch
        self.limit = MAX_MESSAGE_BYTES
        self.batch_seq = 0
        self.cut_total = 0  # events cut to fit a message

    def records(self, events: list[Event]) -> list[Record]:
        """Messages for ``events``, in order: runs of consecutive step events (one or more) become
        batch messages of up to ``step_batch`` events and ``limit`` bytes (one message per
        step costs ~4x the CPU end to end, measured); every other event is a message on its own
        session subject. No message exceeds ``limit``: an event that would is cut to fit,
        with a note (``Event.fitted``)."""
        records: list[Record] = []
        run: list[bytes] = []
        run_bytes = 0
        limit = self.limit

        def flush() -> None:
            nonlocal run_bytes
            # Even a run of one goes out as a batch: with batching on, steps are always on
            # rlsandbox.v1.<node>.steps, where subscribers look for them.
            if run:
                self.batch_seq += 1
                msg_id = f"{self.node_id}/{self.instance}:batch:{self.batch_seq}"
                records.append((steps_subject(self.node_id), msg_id, batch_of(self.node_id, run), len(run)))
            run.clear()
            run_bytes = 0

        for e in events:
            payload = e.to_json()
            if len(payload) > limit - BATCH_OVERHEAD:
                self.cut_total += 1
                log.warning(
                    "events: %s event of %s is %d bytes; cut to fit %d", e.type, e.session or "the node", len(payload), limit
                )
                payload = orjson.dumps(e.fitted(len(payload), limit - BATCH_OVERHEAD).to_dict())
            if e.type == STEP and e.session and self.step_batch > 1:
                if run and run_bytes + len(payload) + BATCH_OVERHEAD > limit:
                    flush()
                run.append(payload)
                run_bytes += len(payload) + 1
                if len(run) >= self.step_batch:
                    flush()
            else:
                flush()
                records.append((e.subject, e.msg_id, payload, 1))
        flush()
        return records

    def refit(self, record: Record) -> list[Record]:
        """A refused message as messages within today's limit (same ids, so replays dedup); [] if
        it is not ours to read."""
        subject, msg_id, payload, _ = record
        try:
            docs, was_batch = decode_all(payload)
        except ValueError:
            return []
        limit = self.limit - BATCH_OVERHEAD
        encoded = []
        for doc in docs:
            one = orjson.dumps(doc)
            if len(one) > limit:
                self.cut_total += 1
                one = orjson.dumps(Event.from_dict(doc).fitted(len(one), limit).to_dict())
            encoded.append(one)
        if not was_batch:
            return [(subject, msg_id, encoded[0], 1)]
        out: list[Record] = []
        part: list[bytes] = []
        size = 0
        for one in encoded:
            if part and size + len(one) + BATCH_OVERHEAD > self.limit:
                out.append((subject, f"{msg_id}.{len(out)}", batch_of(self.node_id, part), len(part)))
                part, size = [], 0
            part.append(one)
            size += len(one) + 1
        if part:
            out.append((subject, f"{msg_id}.{len(out)}", batch_of(self.node_id, part), len(part)))
        return out
