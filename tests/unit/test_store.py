"""The aggregator's store on its own: batches, duplicates, gaps (SQLite in a temporary folder)."""

from __future__ import annotations

from pathlib import Path

from rlsandbox.daemon.events.model import CREATED, STEP, Event, batch_payload
from rlsandbox.daemon.events.store import Store


def ev(type_: str, seq: int, session: str = "s1") -> Event:
    return Event(type_, "n1", session, seq, {"argv": ["true"]} if type_ == STEP else {}, {"run": "r", "task": "t"})


def test_batches_even_of_one_store_each_event_and_duplicates_change_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.sqlite3")
    assert store.apply([ev(CREATED, 1).to_json(), batch_payload("n1", [ev(STEP, 2)])]) == (2, 0, 0)
    assert [e["type"] for e in store.timeline("s1")] == [CREATED, STEP]  # not the batch wrapper
    assert store.apply([batch_payload("n1", [ev(STEP, 3), ev(STEP, 4)])]) == (2, 0, 0)
    # Redelivered: the same events again, in a batch and alone.
    assert store.apply([batch_payload("n1", [ev(STEP, 3), ev(STEP, 4)]), ev(CREATED, 1).to_json()]) == (0, 3, 0)
    (run,) = store.runs()
    assert run["steps"] == 3 and run["missing_events"] == 0 and run["duplicates"] == 3
    assert store.integrity()["duplicates_total"] == 3
    store.close()


def test_gaps_and_garbage_are_counted(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.sqlite3")
    assert store.apply([ev(CREATED, 1).to_json(), ev(STEP, 5).to_json(), b"not json", b'{"v": 2}']) == (2, 0, 2)
    integrity = store.integrity()
    assert integrity["missing_events"] == 3 and integrity["sessions_with_gaps"] == 1 and integrity["invalid"] == 2
    store.close()
