"""Events -> NATS messages (the publisher's encoding, pure): step runs batched within the size
limit, other events on their own subjects, oversized events cut to fit, refused messages refit."""

from __future__ import annotations

import orjson
from rlsandbox.daemon.events.encoding import BATCH_OVERHEAD, Encoder
from rlsandbox.daemon.events.model import CLOSED, STEP, Event, decode_all


def step(seq: int, out: str = "") -> Event:
    return Event(STEP, "n1", "n1-s", seq, {"exit_code": 0, "stdout": out})


def test_step_runs_become_batches_and_other_events_keep_their_place() -> None:
    enc = Encoder("n1", "i1", step_batch=3)
    events = [step(1), step(2), step(3), step(4), Event(CLOSED, "n1", "n1-s", 5, {"reason": "done"}), step(6)]
    records = enc.records(events)
    assert [(r[0], r[3]) for r in records] == [
        ("rlsandbox.v1.n1.steps", 3),
        ("rlsandbox.v1.n1.steps", 1),
        (events[4].subject, 1),
        ("rlsandbox.v1.n1.steps", 1),
    ]
    assert records[2][1] == "n1-s:5"  # a session event's message id: session and seq (JetStream dedups replays)
    seqs = [d["seq"] for r in records for d in decode_all(r[2])[0]]
    assert seqs == [1, 2, 3, 4, 5, 6]  # order kept
    assert len({r[1] for r in records}) == 4


def test_every_message_fits_the_limit_and_a_huge_event_is_cut_with_a_note() -> None:
    enc = Encoder("n1", "i1")
    enc.limit = 8 << 10
    events = [step(i, "x" * 1500) for i in range(1, 30)] + [step(30, "y" * 50_000)]
    records = enc.records(events)
    assert all(len(r[2]) <= enc.limit for r in records)
    assert sum(r[3] for r in records) == 30 and enc.cut_total == 1
    [last] = decode_all(records[-1][2])[0][-1:]
    assert last["seq"] == 30 and "cut" in last["data"]


def test_a_refused_batch_is_refit_to_a_lower_limit_under_derived_ids() -> None:
    enc = Encoder("n1", "i1")
    [record] = enc.records([step(i, "z" * 3000) for i in range(1, 11)])
    enc.limit = 8 << 10  # the server turned out to accept less
    parts = enc.refit(record)
    assert len(parts) > 1 and all(len(p[2]) <= enc.limit for p in parts)
    assert [p[1] for p in parts] == [f"{record[1]}.{i}" for i in range(len(parts))]
    assert [d["seq"] for p in parts for d in decode_all(p[2])[0]] == list(range(1, 11))
    assert enc.refit(("s", "id", b"not ours", 1)) == []
    assert len(orjson.dumps({"x": 1})) < BATCH_OVERHEAD
