"""The aggregator's store on its own: batches, duplicates, gaps (SQLite in a temporary folder)."""

from __future__ import annotations

from pathlib import Path

from rlsandbox.daemon.events.model import ADOPTED, CREATED, STEP, Event, batch_payload
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


def test_numbers_a_restarted_daemon_may_have_skipped_are_not_gaps(tmp_path: Path) -> None:
    """A re-adopted session resumes above its reserved block and declares the block; what is
    missing inside it is counted apart, what is missing outside it is still a gap."""
    store = Store(tmp_path / "a.sqlite3")
    events = [ev(CREATED, 1), ev(STEP, 2), ev(STEP, 3)]  # the first life used 1..3 of the block 1..32
    adopted = Event(ADOPTED, "n1", "s1", 33, {"unused_seq_window": [1, 32]}, {"run": "r"})
    store.apply([e.to_json() for e in [*events, adopted, ev(STEP, 34)]])
    integrity = store.integrity()
    assert integrity["missing_events"] == 0 and integrity["sessions_with_gaps"] == 0
    assert integrity["crash_window_missing"] == 29 and store.runs()[0]["missing_events"] == 0
    # A real gap after the restart is still one.
    store.apply([ev(STEP, 36).to_json()])
    integrity = store.integrity()
    assert integrity["missing_events"] == 1 and integrity["sessions_with_gaps"] == 1
    store.close()
