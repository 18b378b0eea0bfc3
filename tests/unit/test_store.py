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
    """A re-adopted session resumes above its reserved block and declares the numbers it did not
    journal as emitted; the ones above the highest that arrived were not used (not gaps), a
    number missing below one that arrived was used and lost (a gap, named as a crash loss), and
    what is missing outside the window is still a gap."""
    store = Store(tmp_path / "a.sqlite3")
    events = [ev(CREATED, 1), ev(STEP, 2), ev(STEP, 3)]  # journalled as emitted up to 2, block up to 32
    adopted = Event(ADOPTED, "n1", "s1", 33, {"unused_seq_window": [3, 32]}, {"run": "r"})
    store.apply([e.to_json() for e in [*events, adopted, ev(STEP, 34)]])
    integrity = store.integrity()
    assert integrity["missing_events"] == 0 and integrity["sessions_with_gaps"] == 0
    assert integrity["crash_window_unused"] == 29 and integrity["crash_window_lost"] == 0
    assert store.runs()[0]["missing_events"] == 0
    # Event 5 arrived but 4 did not: 4 was used, and is lost.
    store.apply([ev(STEP, 5).to_json()])
    integrity = store.integrity()
    assert integrity["crash_window_lost"] == 1 and integrity["crash_window_unused"] == 27
    assert integrity["missing_events"] == 1
    store.apply([ev(STEP, 4).to_json()])
    # A real gap after the restart is still one.
    store.apply([ev(STEP, 36).to_json()])
    integrity = store.integrity()
    assert integrity["missing_events"] == 1 and integrity["sessions_with_gaps"] == 1
    store.close()
