"""The aggregator's store, the same cases on every database it runs on: SQLite (tests/unit/
test_store.py) and PostgreSQL (tests/integration/test_store_postgres.py). Each test takes ``db``,
the location of a new, empty store (a file path or a ``postgresql://`` URL)."""

from __future__ import annotations

from typing import Any

import pytest
from rlsandbox.daemon.events.model import ADOPTED, CLOSED, CREATED, REWARD, STEP, Event, batch_payload
from rlsandbox.daemon.events.store import Store

T0 = 1_764_000_000.0  # a multiple of 60: minute and window boundaries fall on it


def episode(
    store: Store, session: str, at: float, *, run: str = "r1", task: str = "t1", steps: int = 3,
    step_seconds: float = 0.004, reward: float | None = 1.0, status: str = "ok", tampering: int = 0,
) -> None:  # fmt: skip
    labels = {"run": run, "task": task}
    events = [Event(CREATED, "n1", session, 1, {"pool": "python"}, labels, ts=at)]
    step = {"duration": step_seconds, "exit_code": 0}
    events += [Event(STEP, "n1", session, 2 + i, step, labels, ts=at + 1) for i in range(steps)]
    grade = {"status": status, "reward": reward, "resolved": reward == 1.0, "tampering": ["x"] * tampering}
    events.append(Event(REWARD, "n1", session, 2 + steps, grade, labels, ts=at + 2))
    events.append(Event(CLOSED, "n1", session, 3 + steps, {"reason": "closed by client"}, labels, ts=at + 3))
    steps_batch = batch_payload("n1", [e for e in events if e.type == STEP])
    others = [e.to_json() for e in events if e.type in (REWARD, CLOSED)]
    assert store.apply([events[0].to_json(), steps_batch, *others])[0] == len(events)


def test_activity_and_latency_roll_up_per_second_and_per_minute(db: str) -> None:
    store = Store(db)
    for i in range(10):
        episode(store, f"fast-{i}", T0 + i, steps=9, step_seconds=0.0015)  # 90 steps in (1 ms, 2 ms]
    episode(store, "slow", T0 + 20, steps=10, step_seconds=0.3)  # 10 steps in (0.2 s, 0.5 s]
    series = store.activity(T0, step=10)
    assert [(p["t"], p["steps"], p["created"], p["graded"], p["ended"]) for p in series] == [
        (T0, 81, 10, 8, 7),  # ts T0+1 .. T0+9 for steps, T0+2.. for grades, T0+3.. for ends
        (T0 + 10, 9, 0, 2, 3),
        (T0 + 20, 10, 1, 1, 1),
    ]
    latency = store.latency(T0)
    assert latency["steps"] == 100
    assert 1.0 < latency["p50_ms"] <= 2.0 and 1.0 < latency["p90_ms"] <= 2.0
    assert 200.0 < latency["p99_ms"] <= 500.0  # the slow tenth shows at the tail
    rates = store.rates(T0 + 60)
    assert rates["steps"] == pytest.approx(100 / 60) and rates["created"] == pytest.approx(11 / 60)
    # Redelivered events change no rollup.
    episode_again = Store(db)
    labels = {"run": "r1", "task": "t1"}
    again = Event(STEP, "n1", "slow", 2, {"duration": 0.3}, labels, ts=T0 + 21)
    assert episode_again.apply([batch_payload("n1", [again])])[1] == 1
    assert store.latency(T0)["steps"] == 100 and sum(p["steps"] for p in store.activity(T0)) == 100
    store.close()
    episode_again.close()


def test_a_runs_curve_is_bounded_and_its_sessions_come_in_pages(db: str) -> None:
    store = Store(db)
    for i in range(120):
        # The first half fails, the second half passes, a few infra errors and tampered gradings.
        status = "infra_error" if i % 40 == 7 else "ok"
        reward = None if status == "infra_error" else (1.0 if i >= 60 else 0.0)
        episode(store, f"s{i:03d}", T0 + 10 * i, reward=reward, status=status, tampering=1 if i % 30 == 0 else 0)
    episode(store, "other", T0, run="r2")
    curve = store.curve("r1", points=12)
    assert len(curve) <= 13 and sum(p["gradings"] for p in curve) == 120
    assert curve[0]["mean_reward"] == 0.0 and curve[-1]["mean_reward"] == 1.0
    assert sum(p["infra_errors"] for p in curve) == 3 and sum(p["tampered"] for p in curve) == 4
    assert store.curve("nope") == [] and store.curve("r1", task="no-such-task") == []
    assert sum(p["gradings"] for p in store.curve("r1", task="t1")) == 120  # one task's curve
    first = store.run_sessions("r1", limit=50)
    assert [s["session"] for s in first[:2]] == ["s119", "s118"] and len(first) == 50
    assert first[0]["reward"] == 1.0 and first[0]["status"] == "ok" and first[0]["steps"] == 3
    second = store.run_sessions("r1", before=first[-1]["created_ts"], limit=50)
    third = store.run_sessions("r1", before=second[-1]["created_ts"], limit=50)
    assert len(second) == 50 and len(third) == 20
    assert len({s["session"] for s in first + second + third}) == 120
    (run,) = [r for r in store.runs() if r["name"] == "r1"]
    assert run["tampered"] == 4 and run["gradings"] == 120
    totals = {(r, s): (n, total, rewarded, tampered) for r, s, n, total, rewarded, tampered in store.run_totals()}
    assert totals[("r1", "ok")] == (117, 59.0, 117, 4)  # i = 87 (>= 60) is an infra error
    assert totals[("r1", "infra_error")][0] == 3
    assert totals[("r2", "ok")][0] == 1
    store.close()


def ev(type_: str, seq: int, session: str = "s1") -> Event:
    return Event(type_, "n1", session, seq, {"argv": ["true"]} if type_ == STEP else {}, {"run": "r", "task": "t"})


def test_batches_even_of_one_store_each_event_and_duplicates_change_nothing(db: str) -> None:
    store = Store(db)
    assert store.apply([ev(CREATED, 1).to_json(), batch_payload("n1", [ev(STEP, 2)])]) == (2, 0, 0)
    assert [e["type"] for e in store.timeline("s1")] == [CREATED, STEP]  # not the batch wrapper
    assert store.apply([batch_payload("n1", [ev(STEP, 3), ev(STEP, 4)])]) == (2, 0, 0)
    # Redelivered: the same events again, in a batch and alone.
    assert store.apply([batch_payload("n1", [ev(STEP, 3), ev(STEP, 4)]), ev(CREATED, 1).to_json()]) == (0, 3, 0)
    (run,) = store.runs()
    assert run["steps"] == 3 and run["missing_events"] == 0 and run["duplicates"] == 3
    assert store.integrity()["duplicates_total"] == 3
    store.close()


def test_gaps_and_garbage_are_counted(db: str) -> None:
    store = Store(db)
    assert store.apply([ev(CREATED, 1).to_json(), ev(STEP, 5).to_json(), b"not json", b'{"v": 2}']) == (2, 0, 2)
    integrity = store.integrity()
    assert integrity["missing_events"] == 3 and integrity["sessions_with_gaps"] == 1 and integrity["invalid"] == 2
    store.close()


def test_numbers_a_restarted_daemon_may_have_skipped_are_not_gaps(db: str) -> None:
    """A re-adopted session resumes above its reserved block and declares the numbers it did not
    journal as emitted; the ones above the highest that arrived were not used (not gaps), a
    number missing below one that arrived was used and lost (a gap, named as a crash loss), and
    what is missing outside the window is still a gap."""
    store = Store(db)
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


def test_hostile_values_are_held_or_refused_and_never_stop_the_store(db: str) -> None:
    """Labels that are not text (an object, a NUL), a reward that is not a number, numbers no
    database holds: each event is stored with what can be kept, or counted invalid; the others
    of the same batch are stored."""
    hostile = {"run": "r\0x", "task": {"nested": [1, 2]}}
    events = [
        Event(CREATED, "n1", "h1", 1, {}, hostile, ts=T0),
        Event(STEP, "n1", "h1", 2, {"duration": "slow"}, hostile, ts=T0 + 1),
        Event(REWARD, "n1", "h1", 3, {"status": "ok", "reward": "1.0", "resolved": True}, hostile, ts=T0 + 2),
    ]
    huge_seq = Event(STEP, "n1", "h1", 2**60, {}, hostile, ts=T0).to_json()
    far_future = Event(STEP, "n1", "h1", 4, {}, hostile, ts=1e300).to_json()
    store = Store(db)
    assert store.apply([batch_payload("n1", events[1:2]), events[0].to_json(), events[2].to_json(), huge_seq, far_future]) == (
        3,
        0,
        2,
    )
    (run,) = store.runs()
    assert run["name"] in ("r\0x", "r\ufffdx")  # PostgreSQL's text holds no NUL: a visible mark instead
    (grade,) = store.tasks()
    assert grade["name"] == '{"nested":[1,2]}' and grade["gradings"] == 1 and grade["mean_reward"] is None
    assert store.integrity()["invalid"] == 2
    assert [e["seq"] for e in store.timeline("h1")] == [1, 2, 3]
    store.close()


def test_an_event_the_database_refuses_is_skipped_alone(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No refusal is known (the test above); should one come, it costs that one event, not the
    stream: simulated by a write that raises for one session, as a database error would."""
    store = Store(db)
    original = store._write

    def refusing(session_events: list[Any], node_events: list[Any], bad: int) -> tuple[int, int]:
        if any(ev["session"] == "poison" for ev, _ in session_events):
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        return original(session_events, node_events, bad)

    monkeypatch.setattr(store, "_write", refusing)
    good = [Event(STEP, "n1", "fine", i, {}, {"run": "r"}, ts=T0) for i in (1, 2)]
    bad = Event(STEP, "n1", "poison", 1, {}, {"run": "r"}, ts=T0)
    assert store.apply([batch_payload("n1", [good[0], bad, good[1]]), b"not json"]) == (2, 0, 2)
    assert [e["seq"] for e in store.timeline("fine")] == [1, 2] and store.timeline("poison") == []
    assert store.integrity()["invalid"] == 2
    store.close()
