"""The store of an earlier SQLite version, and the anomaly judge on its own (the dashboard's views
of the store are among the cases every database passes: tests/store_cases.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from rlsandbox.daemon.events.anomalies import AnomalyRules, WindowStats, judge, windows_to_judge
from rlsandbox.daemon.events.store import Store
from store_cases import T0, episode


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
