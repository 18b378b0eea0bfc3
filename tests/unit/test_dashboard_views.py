"""What the dashboard and the anomaly judge read from the store, on a real SQLite store with
events as daemons send them: per-second activity, step latency percentiles, a run's reward curve
and pages of its sessions, Prometheus totals, the store of an earlier version, and the judge."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from rlsandbox.daemon.events.anomalies import AnomalyRules, WindowStats, judge, windows_to_judge
from rlsandbox.daemon.events.model import CLOSED, CREATED, REWARD, STEP, Event, batch_payload
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


def test_activity_and_latency_roll_up_per_second_and_per_minute(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.sqlite3")
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
    episode_again = Store(tmp_path / "a.sqlite3")
    labels = {"run": "r1", "task": "t1"}
    again = Event(STEP, "n1", "slow", 2, {"duration": 0.3}, labels, ts=T0 + 21)
    assert episode_again.apply([batch_payload("n1", [again])])[1] == 1
    assert store.latency(T0)["steps"] == 100 and sum(p["steps"] for p in store.activity(T0)) == 100
    store.close()
    episode_again.close()


def test_a_runs_curve_is_bounded_and_its_sessions_come_in_pages(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.sqlite3")
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


def test_a_store_of_an_earlier_version_gains_the_new_column_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE rewards (session TEXT NOT NULL, seq INTEGER NOT NULL, run TEXT, task TEXT, status TEXT NOT NULL, "
        "reward REAL, resolved INTEGER NOT NULL, ts REAL NOT NULL, PRIMARY KEY (session, seq)) WITHOUT ROWID"
    )
    db.execute("INSERT INTO rewards VALUES ('old', 5, 'r0', 't', 'ok', 1.0, 1, ?)", (T0,))
    db.commit()
    db.close()
    store = Store(path)
    episode(store, "new", T0 + 5, run="r0", tampering=2)
    (run,) = store.runs()
    assert run["gradings"] == 2 and run["tampered"] == 1
    store.close()
    Store(path).close()  # opening again (another aggregator) is harmless


def test_the_judge_finds_each_kind_of_anomaly_once_per_window_and_leaves_normal_runs_alone() -> None:
    rules = AnomalyRules(window=60, baseline_windows=5, min_gradings=10)
    now = T0 + 10 * 60 + rules.settle + 1  # windows up to index T0/60 + 9 are complete and judged
    last = int(T0 // 60) + 9
    assert windows_to_judge(now, rules) == range(last - 2, last + 1)
    steady = [WindowStats("steady", last - i, 20, 0, 20, 10.0, 0) for i in range(8)]
    jump = [WindowStats("hacked", last - i, 20, 0, 20, 4.0, 0) for i in range(1, 8)]
    jump.append(WindowStats("hacked", last, 20, 0, 20, 19.0, 6))  # reward 0.2 -> 0.95, tampering 30%
    broken = [WindowStats("broken", last - 1, 30, 12, 18, 9.0, 0)]  # 40% infra errors
    thin = [WindowStats("thin", last, 5, 5, 0, 0.0, 5)]  # too few gradings to judge
    found = judge(steady + jump + broken + thin, now, rules)
    assert {(a.run, a.kind, a.index) for a in found} == {
        ("hacked", "reward_jump", last),
        ("hacked", "tampering_jump", last),
        ("broken", "infra_error_rate", last - 1),
    }
    reward_jump = next(a for a in found if a.kind == "reward_jump")
    assert reward_jump.data["mean_reward"] == pytest.approx(0.95)
    assert reward_jump.data["baseline_mean_reward"] == pytest.approx(0.2)
    event = reward_jump.event(rules)
    # Its identity is run, kind and window: every aggregator judging it publishes the same message.
    assert event.msg_id == f"_aggregator/anomaly:hacked:reward_jump:{last}" == reward_jump.event(rules).msg_id
    assert event.session == "" and event.data["window_start"] == last * 60 and event.data["kind"] == "reward_jump"
    # A window not complete yet (or not settled) is not judged.
    assert judge([WindowStats("hacked", last + 1, 20, 20, 0, 0.0, 0)], now, rules) == []
