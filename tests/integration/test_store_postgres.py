"""The aggregator's store on a real PostgreSQL server (Debian's package, tests/integration/
conftest.py): the cases every database passes, writers racing on one database, and the command
line reading it."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rlsandbox.daemon.errors import FailedPrecondition
from rlsandbox.daemon.events.model import CLOSED, CREATED, REWARD, STEP, Event, batch_payload
from rlsandbox.daemon.events.store import Store
from rlsandbox.loadtest.postgres import PostgresServer
from store_cases import *  # noqa: F403 - the shared cases, collected here with this module's ``db``
from store_cases import T0


@pytest.fixture
def db(postgres_db: str) -> str:
    return postgres_db


def _episode_payloads(session: str, steps: int, reward: float) -> list[bytes]:
    labels = {"run": "race", "task": f"t{int(session[1:]) % 3}"}
    out = [Event(CREATED, "n1", session, 1, {"pool": "python"}, labels, ts=T0).to_json()]
    for first in range(0, steps, 5):  # the publisher's batches
        batch = [Event(STEP, "n1", session, 2 + i, {"duration": 0.003}, labels, ts=T0 + i) for i in range(first, first + 5)]
        out.append(batch_payload("n1", batch))
    out.append(Event(REWARD, "n1", session, 2 + steps, {"status": "ok", "reward": reward, "resolved": reward == 1}, labels,
                     ts=T0 + steps).to_json())  # fmt: skip
    out.append(Event(CLOSED, "n1", session, 3 + steps, {"reason": "closed by client"}, labels, ts=T0 + steps + 1).to_json())
    return out


def test_writers_racing_on_one_database_store_each_event_once(db: str) -> None:
    """Four aggregators' stores apply overlapping deliveries of the same sessions at once (every
    payload reaches two of them, in random order and batches, as redelivery does): each event
    is stored once, every duplicate counted, the rollups exact, and no writer fails. The writers
    take their row locks in one order, so none of them ever had to try again after a deadlock."""
    sessions, steps = 60, 20
    payloads = [p for s in range(sessions) for p in _episode_payloads(f"s{s}", steps, float(s % 2))]
    rng = random.Random(7)
    writers = [Store(db) for _ in range(4)]
    shares: list[list[bytes]] = [[] for _ in writers]
    for p in payloads:
        for w in rng.sample(range(len(writers)), 2):
            shares[w].append(p)
    for share in shares:
        rng.shuffle(share)
    results: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []

    def write(store: Store, share: list[bytes]) -> None:
        try:
            for i in range(0, len(share), 25):
                results.append(store.apply(share[i : i + 25]))
        except BaseException as e:  # reported below, with the others
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w, s)) for w, s in zip(writers, shares, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    per_episode = 1 + steps + 2
    unique = sessions * per_episode
    delivered = 2 * unique
    assert sum(r[0] for r in results) == unique and sum(r[1] for r in results) == delivered - unique
    check = writers[0]
    integrity = check.integrity()
    assert integrity["events"] == unique and integrity["missing_events"] == 0
    assert integrity["duplicates_total"] == delivered - unique
    (run,) = check.runs()
    assert run["sessions_seen"] == sessions and run["steps"] == sessions * steps and run["open"] == 0
    assert run["gradings"] == sessions and run["mean_reward"] == pytest.approx(0.5)
    assert sum(p["steps"] for p in check.activity(T0 - 10, step=60)) == sessions * steps
    assert check.latency(T0 - 60)["steps"] == sessions * steps
    assert {t["name"]: t["gradings"] for t in check.tasks("race")} == {"t0": 20, "t1": 20, "t2": 20}
    assert [w.retries for w in writers] == [0, 0, 0, 0]
    for w in writers:
        w.close()


def test_the_command_line_reads_a_postgresql_store(db: str, tmp_path: Path) -> None:
    store = Store(db)
    for s in range(3):
        store.apply(_episode_payloads(f"s{s}", 5, 1.0))
    store.close()
    cli = [sys.executable, "-m", "rlsandbox.daemon.cli"]
    stats = subprocess.run([*cli, "stats", "runs", "--db", db], capture_output=True, text=True, check=True).stdout
    assert stats.splitlines()[2].split()[:5] == ["race", "3", "0", "15", "3"]  # name, sessions, open, steps, gradings
    out = tmp_path / "traj.jsonl"
    subprocess.run([*cli, "trajectories", "export", "--run", "race", "--db", db, "--out", str(out)], check=True)
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(e["session"] for e in episodes) == ["s0", "s1", "s2"]
    assert all(e["complete"] and len(e["steps"]) == 5 and e["rewards"][0]["reward"] == 1.0 for e in episodes)


def test_a_database_that_does_not_answer_is_a_clear_error_without_the_password(postgres: PostgresServer) -> None:
    url = f"postgresql://rlsandbox:hunter2@127.0.0.1:{postgres.port}/no_such_database"
    with pytest.raises(FailedPrecondition, match="cannot connect to the aggregator database") as e:
        Store(url)
    assert "hunter2" not in str(e.value) and "no_such_database" in str(e.value)
    store = Store(postgres.create_database("where_hides_the_password").replace("rlsandbox@", "rlsandbox:hunter2@"))
    assert "hunter2" not in store.where and store.where.startswith("postgresql://rlsandbox@127.0.0.1:")
    store.close()
    cli = [sys.executable, "-m", "rlsandbox.daemon.cli", "stats", "runs", "--db", url]
    run = subprocess.run(cli, capture_output=True, text=True)
    assert run.returncode != 0 and "cannot connect" in run.stderr and "hunter2" not in run.stderr
