"""Events over a real nats-server (JetStream) into the aggregator: in order, none lost, none doubled."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nats
import pytest
from helpers import assert_every_step_stored, events_config, eventually, run_steps, running_daemon, wait_run_stored
from rlsandbox.client import AsyncClient
from rlsandbox.daemon.events.aggregator import Aggregator
from rlsandbox.daemon.events.anomalies import AnomalyRules
from rlsandbox.daemon.events.connection import NatsAuth
from rlsandbox.daemon.events.model import STREAM, token
from rlsandbox.daemon.events.nats_server import NatsServer, free_port
from rlsandbox.daemon.events.store import Store
from rlsandbox.daemon.grading.task import load_tasks
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker

TASKS = Path(__file__).resolve().parent.parent / "fixtures" / "tasks"


@pytest.mark.parametrize("step_batch", [256, 1], ids=["steps-batched", "steps-one-per-message"])
async def test_full_episode_arrives_in_order(
    nats_server: NatsServer, aggregator: Aggregator, tmp_path: Path, images: dict[str, str], step_batch: int
) -> None:
    task = next(t for t in load_tasks(TASKS) if t.id == "py-calc")
    node = NodeDaemon(events_config(tmp_path, nats_server.url, events_step_batch=step_batch))
    await node.start()
    try:
        async with AsyncClient(node.address) as client:
            async with client.session(task=task, labels={"run": "run-1"}) as s:
                await s.exec(["python3", "-c", "print('hello')"])
                await s.exec("exit 3")
                await s.write_files({"notes.txt": "abc"})
                graded = await s.grade()
                sid = s.id
            store = aggregator.store

            async def closed() -> bool:
                tl = await asyncio.to_thread(store.timeline, sid)
                return bool(tl) and tl[-1]["type"] == "closed"

            await eventually(closed, what="the closed event")
            status = await client.node_status()
    finally:
        await node.stop()
    timeline = store.timeline(sid)
    assert [e["type"] for e in timeline] == ["created", "step", "step", "files", "reward", "closed"]
    # The subjects in the stream: steps batched per node, or each on its session's subject.
    nc = await nats.connect(nats_server.url)
    info = await nc.jetstream().stream_info(STREAM, subjects_filter=">")
    await nc.close()
    subjects = info.state.subjects or {}
    session_subject = f"rlsandbox.v1.{token(node.config.node_id)}.session.{token(sid)}"
    assert subjects[f"{session_subject}.created"] == 1 and subjects[f"{session_subject}.reward"] == 1
    if step_batch == 1:
        assert subjects[f"{session_subject}.step"] == 2
    else:
        assert f"{session_subject}.step" not in subjects and subjects[f"rlsandbox.v1.{token(node.config.node_id)}.steps"] >= 1
    assert [e["seq"] for e in timeline] == [1, 2, 3, 4, 5, 6]
    assert all(e["labels"] == {"run": "run-1", "task": "py-calc"} and e["node"] == node.config.node_id for e in timeline)
    created, step1, step2, files, reward, end = timeline
    assert created["data"]["pool"] == "python" and created["data"]["task"] == "py-calc"
    assert step1["data"]["argv"] == ["python3", "-c", "print('hello')"] and step1["data"]["stdout_bytes"] == 6
    assert step2["data"]["shell"] == "exit 3" and step2["data"]["exit_code"] == 3
    assert files["data"]["files"] == [{"path": "/workspace/notes.txt", "bytes": 3}]
    assert reward["data"]["status"] == "ok" and reward["data"]["reward"] == graded.reward == 0.0
    assert end["data"]["reason"] == "closed by client"
    assert timeline[0]["ts"] <= timeline[-1]["ts"]
    # Rewards by run and task, node health from heartbeats, and the same through the HTTP API.
    (run,) = store.runs()
    assert run["name"] == "run-1" and run["gradings"] == 1 and run["mean_reward"] == 0.0 and run["missing_events"] == 0
    assert store.tasks("run-1")[0]["name"] == "py-calc"
    nodes = store.nodes()
    assert nodes[0]["node"] == node.config.node_id and "pools" in nodes[0]["data"]
    assert status.events.connected and status.events.published_total >= 6 and status.events.dropped_total == 0
    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{aggregator.http_port}/v1/sessions/{sid}", timeout=10).read()
    )
    assert [e["type"] for e in json.loads(body)] == [e["type"] for e in timeline]
    # The command line reads the same database: stats tables and the trajectory export.
    db = str(tmp_path / "agg.sqlite3")
    cli = [sys.executable, "-m", "rlsandbox.daemon.cli"]
    stats = subprocess.run([*cli, "stats", "runs", "--db", db], capture_output=True, text=True, check=True).stdout
    assert stats.splitlines()[2].split()[:5] == ["run-1", "1", "0", "2", "1"]  # name, sessions, open, steps, gradings
    out = tmp_path / "traj.jsonl"
    subprocess.run([*cli, "trajectories", "export", "--run", "run-1", "--db", db, "--out", str(out)], check=True)
    (episode,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert episode["session"] == sid and episode["complete"] and episode["task"] == "py-calc"
    assert [s["exit_code"] for s in episode["steps"]] == [0, 3] and episode["rewards"][0]["reward"] == 0.0


async def test_nats_down_for_10_s_loses_nothing(
    nats_server: NatsServer, aggregator: Aggregator, tmp_path: Path, images: dict[str, str]
) -> None:
    node = NodeDaemon(events_config(tmp_path, nats_server.url))
    await node.start()
    counter = [0]
    try:
        async with AsyncClient(node.address) as client:
            sessions = [await client.create_session("busybox", labels={"run": "outage"}) for _ in range(8)]
            start = time.monotonic()
            load = asyncio.gather(*(run_steps(s, start + 16, counter) for s in sessions))
            await asyncio.sleep(2)
            await nats_server.stop()
            before_outage = counter[0]
            await asyncio.sleep(10)
            during = counter[0] - before_outage
            outbox_peak = (await client.node_status()).events.outbox_events
            await nats_server.start()
            await load
            for s in sessions:
                await s.close()
            ids = {s.id for s in sessions}
            await wait_run_stored(aggregator.store, "outage", len(ids))
            status = await client.node_status()
    finally:
        await node.stop()
    assert during > 50, "sessions must keep being served while NATS is down"
    assert outbox_peak > 0, "events went to the outbox during the outage"
    assert_every_step_stored(aggregator.store, ids, counter[0])
    assert status.events.dropped_total == 0 and status.events.outbox_events == 0


async def test_outbox_full_counts_drops_and_alerts(tmp_path: Path, images: dict[str, str]) -> None:
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    node = NodeDaemon(events_config(tmp_path, url, events_outbox_max_bytes=20_000, heartbeat_interval=0))
    await node.start()
    server = NatsServer(tmp_path / "js", port=port)
    try:
        async with AsyncClient(node.address) as client:
            async with client.session("busybox", labels={"run": "full"}) as s:
                for _ in range(150):  # ~300 bytes an event: far more than 20 kB
                    assert (await s.exec(["true"])).exit_code == 0  # served all along
                status = (await client.node_status()).events
                assert not status.connected and status.dropped_total > 0
                assert status.outbox_bytes <= 20_000 and status.outbox_events > 0
                dropped = status.dropped_total
            await server.start()
            agg = Aggregator(url, tmp_path / "agg.sqlite3")
            agg_task = asyncio.create_task(agg.run())
            try:

                async def alerted() -> bool:
                    return any(a["kind"] == "outbox_full" for a in await asyncio.to_thread(agg.store.alerts))

                await eventually(alerted, what="the outbox_full alert")
                alerts = [a for a in agg.store.alerts() if a["kind"] == "outbox_full"]
                assert node.events is not None
                # Every dropped event is accounted for by an alert (the session's close came after the reading).
                assert sum(a["data"]["dropped"] for a in alerts) == node.events.stats().dropped_total >= dropped
                # What the outbox held arrives, and the loss is visible: the session never ends, or
                # it ends with a gap in its sequence numbers.
                held = status.outbox_events

                async def replayed() -> bool:
                    return bool((await asyncio.to_thread(agg.store.integrity))["events"] >= held)

                await eventually(replayed, what="the outbox replay")
                run = next(r for r in agg.store.runs() if r["name"] == "full")
                assert run["open"] == 1 or run["missing_events"] > 0, run
            finally:
                agg.stop()
                await agg_task
    finally:
        await node.stop()
        await server.stop()


async def _aggregator_process(url: str, db: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlsandbox.daemon.cli", "--log-level", "WARNING", "aggregator", "--nats", url, "--db", str(db),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def test_aggregator_killed_and_restarted_resumes(nats_server: NatsServer, tmp_path: Path, images: dict[str, str]) -> None:
    db = tmp_path / "agg.sqlite3"
    node = NodeDaemon(events_config(tmp_path, nats_server.url))
    await node.start()
    counter = [0]
    proc = await _aggregator_process(nats_server.url, db)
    try:
        async with AsyncClient(node.address) as client:
            sessions = [await client.create_session("busybox", labels={"run": "kill"}) for _ in range(6)]
            load = asyncio.gather(*(run_steps(s, time.monotonic() + 8, counter) for s in sessions))
            await asyncio.sleep(3)
            os.kill(proc.pid, signal.SIGKILL)  # mid-stream, without warning
            await proc.wait()
            await asyncio.sleep(1)
            proc = await _aggregator_process(nats_server.url, db)
            await load
            for s in sessions:
                await s.close()
        store = Store(db)
        ids = {s.id for s in sessions}

        async def complete() -> bool:
            runs = await asyncio.to_thread(store.runs)
            r = next((r for r in runs if r["name"] == "kill"), None)
            return r is not None and r["open"] == 0 and r["sessions_seen"] == len(ids) and r["missing_events"] == 0

        await eventually(complete, timeout=60, what="the restarted aggregator to catch up")
        steps = sum(len([e for e in store.timeline(sid) if e["type"] == "step"]) for sid in ids)
        assert steps == counter[0]
        store.close()
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        await node.stop()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
async def test_two_aggregators_share_the_work(
    nats_server: NatsServer, tmp_path: Path, images: dict[str, str], database: str, request: pytest.FixtureRequest
) -> None:
    """Two aggregators in one queue group write one database: a SQLite file, or PostgreSQL (the
    cluster's store); each takes part, and the run is whole with no event twice."""
    db = str(tmp_path / "shared.sqlite3") if database == "sqlite" else request.getfixturevalue("postgres_db")
    aggs = [Aggregator(nats_server.url, db, batch=50) for _ in range(2)]
    tasks = [asyncio.create_task(a.run()) for a in aggs]
    node = NodeDaemon(events_config(tmp_path, nats_server.url))
    await node.start()
    counter = [0]
    try:
        await asyncio.gather(*(asyncio.wait_for(a.started.wait(), 30) for a in aggs))
        async with AsyncClient(node.address) as client:
            sessions = [await client.create_session("busybox", labels={"run": "shared"}) for _ in range(8)]
            await asyncio.gather(*(run_steps(s, time.monotonic() + 5, counter) for s in sessions))
            for s in sessions:
                await s.close()

        async def complete() -> bool:
            runs = await asyncio.to_thread(aggs[0].store.runs)
            r = next((r for r in runs if r["name"] == "shared"), None)
            return r is not None and r["open"] == 0 and r["missing_events"] == 0 and r["sessions_seen"] == 8

        await eventually(complete, what="both aggregators to drain the stream")
    finally:
        for a in aggs:
            a.stop()
        await asyncio.gather(*tasks)
        await node.stop()
    assert all(a.applied_total > 0 for a in aggs), [a.applied_total for a in aggs]
    check = Store(db)
    assert check.integrity()["duplicates"] == 0
    steps = check.runs()
    check.close()
    assert next(r for r in steps if r["name"] == "shared")["steps"] == counter[0]


async def test_the_aggregator_rides_out_a_postgresql_crash(
    nats_server: NatsServer, tmp_path: Path, images: dict[str, str]
) -> None:
    """PostgreSQL crashes (immediate shutdown: every connection cut) while sessions run and is
    back 4 s later on the same port: the aggregator keeps its batches unacknowledged meanwhile,
    reconnects, and every step ends up stored once; its anomaly watcher and process live on."""
    from rlsandbox.loadtest.postgres import postgres_server

    # Durable: with synchronous_commit off a crash loses commits the aggregator has acknowledged.
    with postgres_server(durable=True) as pg:
        db = pg.create_database("crash")
        agg = Aggregator(nats_server.url, db, batch=50, anomaly_rules=AnomalyRules(window=1, min_gradings=1), http="127.0.0.1:0")

        async def metrics() -> str:
            url = f"http://127.0.0.1:{agg.http_port}/metrics"
            return await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())

        task = asyncio.create_task(agg.run())
        node = NodeDaemon(events_config(tmp_path, nats_server.url))
        await node.start()
        counter = [0]
        try:
            await asyncio.wait_for(agg.started.wait(), 30)
            async with AsyncClient(node.address) as client:
                sessions = [await client.create_session("busybox", labels={"run": "pgcrash"}) for _ in range(4)]
                load = asyncio.gather(*(run_steps(s, time.monotonic() + 9, counter) for s in sessions))
                await asyncio.sleep(2)
                await asyncio.to_thread(pg.crash)
                await asyncio.sleep(4)
                assert not task.done()
                down = await metrics()  # still served: the process's own numbers, and the store down
                assert "rlsandbox_aggregator_store_up 0.0" in down and "rlsandbox_aggregator_store_errors_total" in down
                await asyncio.to_thread(pg.start)
                await load
                for s in sessions:
                    await s.close()
            await wait_run_stored(agg.store, "pgcrash", 4)
            assert_every_step_stored(agg.store, {s.id for s in sessions}, counter[0])
            assert agg.store_errors_total > 0  # it did meet the outage
            assert "rlsandbox_aggregator_store_up 1.0" in await metrics()
        finally:
            agg.stop()
            await task
            await node.stop()


async def test_stopping_mid_publish_keeps_the_batch_in_the_outbox(nats_server: NatsServer, tmp_path: Path) -> None:
    """NATS hangs (SIGSTOP: no acknowledgement comes) while a batch is being published, and the
    daemon stops: the batch is in the outbox, and a new publisher sends it once NATS answers."""
    from rlsandbox.daemon.events.model import STEP, Event
    from rlsandbox.daemon.events.outbox import Outbox
    from rlsandbox.daemon.events.publisher import EventPublisher

    outbox = tmp_path / "outbox.sqlite3"

    def publisher() -> EventPublisher:
        return EventPublisher("n1", "i1", nats_url=nats_server.url, outbox_path=outbox, outbox_max_bytes=1 << 20)

    first = publisher()
    await first.start()
    await eventually(lambda: asyncio.sleep(0, first.stats().connected), what="connected")
    assert nats_server.process is not None
    os.kill(nats_server.process.pid, signal.SIGSTOP)
    try:
        for seq in range(1, 11):
            first.emit(Event(STEP, "n1", "s1", seq, {"argv": ["true"]}, {"run": "hang"}))
        await asyncio.sleep(0.5)  # the batch is out, its acknowledgements are not coming
        await first.stop(drain_timeout=0.2)
        kept = Outbox.opened(outbox, 1 << 20)
        assert kept.count == 10
        kept.close()
    finally:
        os.kill(nats_server.process.pid, signal.SIGCONT)
    second = publisher()
    await second.start()
    await eventually(lambda: asyncio.sleep(0, second.stats().published_total >= 10), what="the replay")
    await second.stop()


@pytest.mark.parametrize("method", ["user_password", "token"])
# nats-py leaves a connection's socket to the garbage collector when the server refuses the
# credentials (the wrong secret below): its ResourceWarning is nats-py's, not a leak of ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_nats_credentials(tmp_path: Path, images: dict[str, str], method: str) -> None:
    """A NATS server that requires credentials: the daemon and the aggregator bring them from
    files; a daemon with a wrong secret publishes nothing, keeps its events in the outbox and
    says why in GetNodeStatus."""
    secret = tmp_path / "secret"
    secret.write_text("s3cret-for-rlsandbox\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-secret\n")
    if method == "user_password":
        server_args = ["--user", "rls", "--pass", "s3cret-for-rlsandbox"]
        good = {"nats_user": "rls", "nats_password_file": str(secret)}
        bad = {"nats_user": "rls", "nats_password_file": str(wrong)}
        agg_auth = NatsAuth(user="rls", password_file=str(secret))
    else:
        server_args = ["--auth", "s3cret-for-rlsandbox"]
        good = {"nats_token_file": str(secret)}
        bad = {"nats_token_file": str(wrong)}
        agg_auth = NatsAuth(token_file=str(secret))
    server = NatsServer(tmp_path / "jetstream", extra_args=server_args)
    await server.start()
    agg = Aggregator(server.url, tmp_path / "agg.sqlite3", auth=agg_auth)
    agg_task = asyncio.create_task(agg.run())
    try:
        await asyncio.wait_for(agg.started.wait(), 30)
        (tmp_path / "good").mkdir()
        async with running_daemon(events_config(tmp_path / "good", server.url, **good)) as node:
            async with AsyncClient(node.address) as client, client.session("busybox") as s:
                await s.exec("true")
                sid = s.id
            await eventually(lambda: _has_closed(agg.store, sid), what="the events of the authenticated daemon")
        (tmp_path / "bad").mkdir()
        bad_config = events_config(tmp_path / "bad", server.url, node_id="wrong-secret", **bad)
        async with running_daemon(bad_config) as node, AsyncClient(node.address) as client:
            async with client.session("busybox") as s:
                await s.exec("true")

            async def refused() -> bool:
                st = (await client.node_status()).events
                return not st.connected and "authorization" in st.last_error.lower()

            await eventually(refused, timeout=20, what="the authorization error in GetNodeStatus")
            assert (await client.node_status()).events.published_total == 0
        assert node.events is not None and node.events.outbox.count >= 3  # kept for a later start, not lost
    finally:
        agg.stop()
        await asyncio.wait_for(agg_task, 30)
        await server.stop()


async def _has_closed(store: Store, sid: str) -> bool:
    timeline = await asyncio.to_thread(store.timeline, sid)
    return bool(timeline) and timeline[-1]["type"] == "closed"


async def test_no_event_can_block_the_others(tmp_path: Path) -> None:
    """A server that accepts 64 KB messages: events with a 200 KB field are cut to fit (with a
    note), also those made before the publisher learned the server's limit; a message in the
    outbox that is not an event it can read (left by something else) is dead-lettered, counted
    and alerted, while everything behind it goes out."""
    from rlsandbox.daemon.events.model import STEP, Event
    from rlsandbox.daemon.events.outbox import Outbox
    from rlsandbox.daemon.events.publisher import EventPublisher

    conf = tmp_path / "nats.conf"
    conf.write_text("max_payload: 65536\n")
    server = NatsServer(tmp_path / "jetstream", extra_args=["-c", str(conf)])
    await server.start()
    outbox_path = tmp_path / "outbox.sqlite3"
    stale = Outbox.opened(outbox_path, 16 << 20)
    big = Event("created", "n1", "old", 1, {"blob": "x" * 300_000})
    stale.append([(big.subject, big.msg_id, b"not an event " * 30_000, 1)])
    stale.close()
    publisher = EventPublisher("n1", "i1", nats_url=server.url, outbox_path=outbox_path, outbox_max_bytes=16 << 20)
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await publisher.start()
        publisher.emit(Event("created", "n1", "s1", 1, {"pool": "python", "huge": "y" * 200_000}, {"run": "cut"}))
        for seq in range(2, 12):
            publisher.emit(Event(STEP, "n1", "s1", seq, {"argv": ["true"], "out": "z" * 20_000}))
        await eventually(lambda: asyncio.sleep(0, publisher.stats().published_total >= 12), what="everything behind the bad one")
        stats = publisher.stats()
        assert stats.dead_lettered_total == 1 and stats.cut_total >= 1, stats
        assert publisher.outbox.dead_letters()[0][1] == big.msg_id
        created = await js.get_last_msg(STREAM, f"rlsandbox.v1.{token('n1')}.session.s1.created")
        doc = json.loads(created.data)
        assert doc["data"]["cut"]["fields"] == ["huge"] and doc["data"]["pool"] == "python"
        alert = json.loads((await js.get_last_msg(STREAM, f"rlsandbox.v1.{token('n1')}.node.alert")).data)
        assert alert["data"]["kind"] == "dead_letter" and alert["data"]["msg_id"] == big.msg_id
        await nc.close()
    finally:
        await publisher.stop()
        await server.stop()


async def test_reward_anomalies_become_one_alert_event_across_aggregators_and_show_in_metrics(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A run's mean reward jumps and its tampering with it (what a policy that found a hack looks
    like): two aggregators sharing the store both judge the window; JetStream's duplicate window
    and the store's key keep one alert of each kind, which the alert API and /metrics show. The
    reward events come through the real nats-server in the daemon's own format."""
    from rlsandbox.daemon.events.anomalies import AnomalyRules
    from rlsandbox.daemon.events.model import REWARD, Event

    rules = AnomalyRules(window=2.0, baseline_windows=5, min_gradings=5, settle=0.5)
    db = tmp_path / "shared.sqlite3"
    aggs = [Aggregator(nats_server.url, db, anomaly_rules=rules, http="127.0.0.1:0" if i == 0 else None) for i in range(2)]
    tasks = [asyncio.create_task(a.run()) for a in aggs]
    nc = await nats.connect(nats_server.url)
    try:
        await asyncio.gather(*(asyncio.wait_for(a.started.wait(), 30) for a in aggs))
        js = nc.jetstream()
        last = int((time.time() - rules.settle) // rules.window) - 1  # the newest complete window
        n = 0
        for index in range(last - 5, last + 1):
            hacked = index == last
            for i in range(8):
                n += 1
                ts = index * rules.window + 0.1 + i * 0.1
                tampering = ["x"] if hacked else []
                data = {"status": "ok", "reward": 0.9 if hacked else 0.1, "resolved": hacked, "tampering": tampering}
                event = Event(REWARD, "n-fake", f"s{n}", 1, data, {"run": "hacked", "task": "t"}, ts=ts)
                await js.publish(event.subject, event.to_json(), headers={"Nats-Msg-Id": event.msg_id})

        async def alerted() -> bool:
            kinds = [a["kind"] for a in await asyncio.to_thread(aggs[0].store.alerts)]
            return "reward_jump" in kinds and "tampering_jump" in kinds

        await eventually(alerted, timeout=30, what="the anomaly alerts")
        await asyncio.sleep(3 * rules.window)  # both aggregators judged the window again meanwhile
        alerts = await asyncio.to_thread(aggs[0].store.alerts)
        assert sorted(a["kind"] for a in alerts) == ["reward_jump", "tampering_jump"], alerts
        jump = next(a for a in alerts if a["kind"] == "reward_jump")
        assert jump["node"] == "_aggregator" and jump["data"]["run"] == "hacked"
        assert jump["data"]["mean_reward"] == pytest.approx(0.9) and jump["data"]["baseline_mean_reward"] == pytest.approx(0.1)
        assert jump["data"]["window_start"] == last * rules.window
        assert sum(a.anomalies_total for a in aggs) >= 2  # published (repeats dropped downstream)
        body = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{aggs[0].http_port}/metrics", timeout=10).read().decode()
        )
        assert 'rlsandbox_run_gradings_total{run="hacked",status="ok"} 48.0' in body
        assert 'rlsandbox_run_tampered_total{run="hacked"} 8.0' in body
        assert 'rlsandbox_aggregator_alerts_total{kind="reward_jump"} 1.0' in body
    finally:
        await nc.close()
        for a in aggs:
            a.stop()
        await asyncio.gather(*tasks)
