"""The session manager's own logic, against a fake pool (milliseconds, no Docker).

Admission and idempotency, tombstones, step dedup, reaping, failure during create, sandbox death,
the journal and re-adoption, and event numbering. The same paths run against real sandboxes in
tests/integration; here each rule is pinned down on its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fakes import FakePool, FakePublisher, result
from rlsandbox.daemon.errors import FailedPrecondition, NotFound, ResourceExhausted, SandboxDied, Unavailable
from rlsandbox.daemon.journal import SessionJournal
from rlsandbox.daemon.model import ExecRequest, FileWrite
from rlsandbox.daemon.session import SessionManager, SessionOptions, SessionState


def manager(pool: FakePool | None = None, **kw: object) -> tuple[SessionManager, FakePool]:
    pool = pool or FakePool()
    return SessionManager("n1", {pool.name: pool}, max_sessions=int(kw.pop("max_sessions", 8)), **kw), pool  # type: ignore[arg-type]


def shell(cmd: str) -> ExecRequest:
    return ExecRequest(shell=cmd)


async def test_create_exec_close_and_the_tombstone() -> None:
    m, pool = manager(FakePool(run=lambda r: f"ran {r.shell} in {r.cwd}"))
    s = await m.create(SessionOptions(pool="default", env={"A": "1"}))
    assert s.state is SessionState.READY and s.id.startswith("n1-")
    res, replayed = await m.exec(s.id, shell("ls"))
    assert res.stdout == b"ran ls in /work" and not replayed  # the pool's workdir by default
    sent = pool.leased[0].channel.execs[0]  # type: ignore[attr-defined]
    assert sent.env == {"A": "1"} and s.steps == 1 and m.execs_total == 1
    assert await m.close(s.id, "done here")
    assert pool.released == [("default-1", "done here")] and pool.reused == [True]  # a clean end: may be recycled
    assert not await m.close(s.id)  # a second close: already ended
    with pytest.raises(NotFound, match="ended 0 s ago: done here"):
        m.get(s.id)
    with pytest.raises(NotFound, match="not found on node n1"):
        m.get("n1-nope")


async def test_admission_limit_and_unknown_pool() -> None:
    m, _ = manager(max_sessions=2)
    await m.create(SessionOptions(pool="default"))
    await m.create(SessionOptions(pool="default"))
    with pytest.raises(ResourceExhausted, match="maximum of 2 sessions"):
        await m.create(SessionOptions(pool="default"))
    with pytest.raises(NotFound, match="unknown pool 'gpu'; this node has: default"):
        await m.create(SessionOptions(pool="gpu"))
    m.stop_accepting()
    with pytest.raises(Unavailable, match="shutting down"):
        await m.create(SessionOptions(pool="default"))
    await m.close_all("test over")
    assert not m.sessions


async def test_idempotent_create_retried_while_waiting_gets_the_same_session() -> None:
    m, pool = manager()
    pool.gate = asyncio.Event()
    first = asyncio.create_task(m.create(SessionOptions(pool="default", idempotency_key="k1")))
    retry = asyncio.create_task(m.create(SessionOptions(pool="default", idempotency_key="k1")))
    await asyncio.sleep(0)
    pool.gate.set()
    a, b = await asyncio.gather(first, retry)
    assert a is b and len(pool.leased) == 1
    await m.close(a.id)
    with pytest.raises(FailedPrecondition, match=f"belongs to session {a.id}, which ended: closed by client"):
        await m.create(SessionOptions(pool="default", idempotency_key="k1"))


async def test_failed_create_leaves_no_session_and_frees_its_key() -> None:
    m, pool = manager()
    pool.fail_acquire = ResourceExhausted("pool default is exhausted")
    with pytest.raises(ResourceExhausted):
        await m.create(SessionOptions(pool="default", idempotency_key="k2"))
    assert not m.sessions and not pool.leased
    pool.fail_acquire = None
    s = await m.create(SessionOptions(pool="default", idempotency_key="k2"))  # the retry is a new attempt
    assert s.state is SessionState.READY


async def test_failed_setup_releases_the_sandbox(tmp_path: Path) -> None:
    journal = SessionJournal.opened(tmp_path / "j.sqlite3", "n1")
    m, pool = manager(journal=journal)

    async def broken(entry: object) -> None:
        raise OSError("disk gone")

    journal.record = broken  # type: ignore[assignment,method-assign]
    with pytest.raises(OSError, match="disk gone"):
        await m.create(SessionOptions(pool="default"))
    assert not m.sessions and not pool.leased and pool.released == [("default-1", "session setup failed")]
    await journal.close()


async def test_step_dedup_replays_a_retry_and_refuses_another_command() -> None:
    m, pool = manager(FakePool(run=lambda r: "once"))
    s = await m.create(SessionOptions(pool="default"))
    first, replayed = await m.exec(s.id, shell("echo hi"), seq=7)
    again, replayed2 = await m.exec(s.id, shell("echo hi"), seq=7)
    assert (replayed, replayed2) == (False, True) and again is first
    assert len(pool.leased[0].channel.execs) == 1  # type: ignore[attr-defined]
    with pytest.raises(FailedPrecondition, match=r"seq 7 .* already ran a different command"):
        await m.exec(s.id, shell("rm -rf /"), seq=7)
    assert s.steps == 1


async def test_concurrent_twins_of_a_step_run_it_once() -> None:
    gate = asyncio.Event()

    async def slow(req: ExecRequest) -> str:
        await gate.wait()
        return "done"

    m, pool = manager(FakePool(run=slow))
    s = await m.create(SessionOptions(pool="default"))
    a = asyncio.create_task(m.exec(s.id, shell("make"), seq=1))
    b = asyncio.create_task(m.exec(s.id, shell("make"), seq=1))
    await asyncio.sleep(0.01)
    gate.set()
    (ra, pa), (rb, pb) = await asyncio.gather(a, b)
    assert ra is rb and {pa, pb} == {False, True} and len(pool.leased[0].channel.execs) == 1  # type: ignore[attr-defined]


async def test_a_failed_step_may_be_retried_for_real() -> None:
    calls = []

    def flaky(req: ExecRequest) -> str:
        calls.append(req)
        if len(calls) == 1:
            raise TimeoutError("agent did not answer")
        return "ok"

    m, _ = manager(FakePool(run=flaky))
    s = await m.create(SessionOptions(pool="default"))
    with pytest.raises(TimeoutError):
        await m.exec(s.id, shell("x"), seq=3)
    res, replayed = await m.exec(s.id, shell("x"), seq=3)
    assert res.stdout == b"ok" and not replayed and len(calls) == 2


async def test_a_sandbox_dying_under_a_step_ends_its_session_with_the_engines_reason() -> None:
    def dies(req: ExecRequest) -> str:
        raise SandboxDied("agent connection lost")

    m, pool = manager(FakePool(run=dies))
    s = await m.create(SessionOptions(pool="default"))
    # Out of memory at the sandbox's own limit: the episode's doing, said as such (never masked).
    with pytest.raises(SandboxDied, match=r"OOM-killed at its memory limit; the episode's own doing: .*; start a new") as died:
        await m.exec(s.id, shell("true"), seq=1)
    assert died.value.fields["fault"] == "the sandbox died of the episode's own doing: OOM-killed at its memory limit"
    assert s.state is SessionState.FAILED and not m.sessions
    assert pool.released == [("default-1", "sandbox died: OOM-killed at its memory limit")] and pool.reused == [False]
    with pytest.raises(NotFound, match="sandbox died: OOM-killed") as gone:
        m.get(s.id)
    assert gone.value.fields["fault"] == died.value.fields["fault"]


async def test_calls_meeting_a_dying_sandbox_all_learn_whether_it_was_the_episodes_doing() -> None:
    """While the engine is asked why a sandbox died (seconds, when it waits for the OOM event),
    calls arriving meanwhile (a step, a file read, a session lookup, a grade's) wait for its
    account: answered NOT_FOUND without the fault, a trainer would mask the episode's own doing."""
    pool = FakePool()
    pool.death_told = asyncio.Event()
    m, _ = manager(pool)
    s = await m.create(SessionOptions(pool="default"))
    s.sandbox.channel.die("agent stream ended")  # type: ignore[union-attr]
    first = asyncio.create_task(m.exec(s.id, shell("true")))
    await asyncio.sleep(0.01)
    assert s.state is SessionState.FAILED and not first.done()  # found dead; the engine not heard yet
    later = [
        asyncio.create_task(m.exec(s.id, shell("true"))),
        asyncio.create_task(m.read_files(s.id, ["a"], max_bytes=10, timeout=1)),
        asyncio.create_task(m.settled(s.id)),
    ]
    await asyncio.sleep(0.01)
    assert not any(t.done() for t in later)
    pool.death_told.set()
    for task in [first, *later]:
        with pytest.raises((SandboxDied, NotFound)) as ended:
            await task
        assert ended.value.fields["fault"] == "the sandbox died of the episode's own doing: OOM-killed at its memory limit"


async def test_reaper_closes_idle_sessions_but_never_a_busy_one() -> None:
    gate = asyncio.Event()

    async def slow(req: ExecRequest) -> str:
        await gate.wait()
        return ""

    m, pool = manager(FakePool(run=slow))
    idle = await m.create(SessionOptions(pool="default", idle_timeout=0.01))
    busy = await m.create(SessionOptions(pool="default", idle_timeout=0.01))
    old = await m.create(SessionOptions(pool="default", max_lifetime=0.01))
    running = asyncio.create_task(m.exec(busy.id, shell("sleep")))
    await asyncio.sleep(0.05)
    assert busy.in_flight == 1
    await m.reap()
    assert set(m.sessions) == {busy.id}
    assert m.reaped_total == 2
    with pytest.raises(NotFound, match=r"idle timeout after 0\.01 s"):
        m.get(idle.id)
    with pytest.raises(NotFound, match=r"maximum lifetime of 0\.01 s"):
        m.get(old.id)
    gate.set()
    await running
    await asyncio.sleep(0.05)  # idle again, now with nothing in flight
    await m.reap()
    assert not m.sessions and not pool.leased


async def test_reaper_ends_sessions_whose_sandbox_died() -> None:
    m, pool = manager()
    s = await m.create(SessionOptions(pool="default"))
    assert s.sandbox is not None
    s.sandbox.channel.die("container exited")  # type: ignore[attr-defined]
    await m.reap()
    assert s.state is SessionState.FAILED and not pool.leased


async def test_files_go_through_the_manager_counted_in_flight() -> None:
    events = FakePublisher()
    m, _ = manager(events=events)
    s = await m.create(SessionOptions(pool="default"))
    await m.write_files(s.id, [FileWrite("/work/a.txt", b"hello")], timeout=5)
    [read] = await m.read_files(s.id, ["/work/a.txt"], max_bytes=3, timeout=5)
    assert (read.data, read.size, read.truncated) == (b"hel", 5, True)
    assert s.in_flight == 0
    assert [e.data for e in events.events if e.type == "files"] == [{"files": [{"path": "/work/a.txt", "bytes": 5}], "count": 1}]


async def test_events_are_numbered_without_holes_and_confirmed() -> None:
    events = FakePublisher()
    m, _ = manager(events=events)
    s = await m.create(SessionOptions(pool="default", labels={"run": "r1"}))
    for i in range(3):
        await m.exec(s.id, shell(f"step {i}"))
    await m.close(s.id)
    assert events.of(s.id) == [(1, "created"), (2, "step"), (3, "step"), (4, "step"), (5, "closed")]
    assert all(e.labels == {"run": "r1"} for e in events.events)
    assert s.acked_seq == 4 and m.recorder.unconfirmed_total == 0  # every answered call's events were durable


async def test_a_stalled_publisher_costs_the_confirm_bound_and_is_counted() -> None:
    events = FakePublisher(acks=False)
    m, _ = manager(events=events, events_confirm_timeout=0.02)
    s = await m.create(SessionOptions(pool="default"))
    await m.exec(s.id, shell("true"))
    assert m.recorder.unconfirmed_total == 2  # created and the step: answered at the bound


async def test_timeout_storm_alert() -> None:
    timed_out = result()
    timed_out = type(timed_out)(None, 9, True, b"", b"", 0, 0, False, False, 1.0)
    events = FakePublisher()
    m, _ = manager(FakePool(run=lambda r: timed_out), events=events, events_confirm_timeout=0)
    s = await m.create(SessionOptions(pool="default"))
    for _ in range(50):
        await m.exec(s.id, shell("hang"))
    assert [t for t, d in events.node_events] == ["alert"] and events.node_events[0][1]["kind"] == "timeout_storm"


async def test_recovery_readopts_live_sessions_and_buries_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    journal = SessionJournal.opened(path, "n1")
    events = FakePublisher()
    m, _ = manager(journal=journal, events=events)
    kept = await m.create(SessionOptions(pool="default", labels={"run": "r"}, idempotency_key="keep"))
    gone = await m.create(SessionOptions(pool="default", idempotency_key="gone"))
    await m.exec(kept.id, shell("true"))
    await m.exec(kept.id, shell("true"))
    await journal.close()  # the daemon dies here (its journal is what is left)

    journal2 = SessionJournal.opened(path, "n1")
    events2 = FakePublisher()
    m2, pool2 = manager(journal=journal2, events=events2)
    assert kept.sandbox is not None and gone.sandbox is not None
    pool2.adoptable = {kept.sandbox.name}
    assert await m2.recover({kept.sandbox.name: "running"}) == (1, 1)
    again = m2.get(kept.id)
    assert again.state is SessionState.READY and again.steps == 2 and again.options.labels == {"run": "r"}
    assert (await m2.create(SessionOptions(pool="default", idempotency_key="keep"))) is again
    with pytest.raises(NotFound, match="lost when the daemon restarted: its container is gone"):
        m2.get(gone.id)
    with pytest.raises(FailedPrecondition, match="which ended: lost when the daemon restarted"):
        await m2.create(SessionOptions(pool="default", idempotency_key="gone"))
    [(adopted_seq, kind)] = events2.of(kept.id)
    assert kind == "adopted" and adopted_seq > 3  # above the block the earlier life reserved
    assert [e.type for e in events2.events if e.session == gone.id] == ["failed"]
    await m2.close_all("test over")
    await asyncio.sleep(0.05)
    await journal2.close()
    assert not SessionJournal.opened(path, "n1").load()  # closed sessions leave no row


async def test_a_journalled_create_answers_before_jetstream_and_a_next_life_publishes_its_created_event(
    tmp_path: Path,
) -> None:
    """CreateSession does not wait for JetStream when the journal row (durable before the hand-out)
    holds the `created` event: the next life publishes it again unless the row says it was acked."""
    path = tmp_path / "j.sqlite3"
    journal = SessionJournal.opened(path, "n1")
    events = FakePublisher()
    m, _ = manager(journal=journal, events=events, events_confirm_timeout=5.0)
    acked = await m.create(SessionOptions(pool="default"))
    await m.exec(acked.id, shell("true"))  # its `created` acknowledged, journalled as emitted
    events.acks = False  # now JetStream stops answering
    started = asyncio.get_running_loop().time()
    kept = await m.create(SessionOptions(pool="default", labels={"run": "r"}))
    gone = await m.create(SessionOptions(pool="default"))
    assert asyncio.get_running_loop().time() - started < 1.0 and m.recorder.unconfirmed_total == 0
    first = {e.session: e for e in events.events if e.type == "created"}
    await journal.close()  # the daemon dies here

    journal2 = SessionJournal.opened(path, "n1")
    events2 = FakePublisher()
    m2, pool2 = manager(journal=journal2, events=events2)
    assert kept.sandbox is not None and acked.sandbox is not None
    pool2.adoptable = {kept.sandbox.name, acked.sandbox.name}
    assert await m2.recover({kept.sandbox.name: "running", acked.sandbox.name: "running"}) == (2, 1)
    assert [kind for _, kind in events2.of(acked.id)] == ["adopted"]  # acknowledged: not again
    for s, last in ((kept, "adopted"), (gone, "failed")):
        assert [kind for _, kind in events2.of(s.id)] == ["created", last] and events2.of(s.id)[0][0] == 1
        again = next(e for e in events2.events if e.session == s.id and e.type == "created")
        assert again.data == first[s.id].data and again.labels == first[s.id].labels
    await m2.close_all("test over")
    await asyncio.sleep(0.05)
    await journal2.close()


async def test_a_create_whose_journal_row_failed_waits_for_jetstream(tmp_path: Path) -> None:
    journal = SessionJournal.opened(tmp_path / "j.sqlite3", "n1")

    def failing(*args: object) -> None:
        raise OSError("disk full")

    journal._apply = failing  # type: ignore[method-assign]
    events = FakePublisher(acks=False)
    m, _ = manager(journal=journal, events=events, events_confirm_timeout=0.05)
    await m.create(SessionOptions(pool="default"))
    assert journal.write_errors >= 1 and m.recorder.unconfirmed_total == 1  # it waited (to the bound)
    await m.close_all("test over")
    await journal.close()


async def test_a_session_ending_before_its_created_event_is_durable_waits_for_it_before_its_row_goes(
    tmp_path: Path,
) -> None:
    """The journal row is the only durable copy of an unacknowledged `created` event: closing the
    session (its row deleted) waits for the event first, or a crash right after the close would
    lose the event of an answered CreateSession."""
    path = tmp_path / "j.sqlite3"
    journal = SessionJournal.opened(path, "n1")
    events = FakePublisher(acks=False)
    m, _ = manager(journal=journal, events=events, events_confirm_timeout=5.0)
    s = await m.create(SessionOptions(pool="default"))
    closing = asyncio.create_task(m.close(s.id))
    await asyncio.sleep(0.1)
    assert not closing.done()  # waiting for JetStream ...
    reader = SessionJournal.opened(path, "n1")
    assert [e.session for e in reader.load()] == [s.id]  # ... with the row kept
    await reader.close()
    events.acks = True
    events.flush_soon()
    assert await asyncio.wait_for(closing, 2) is True
    assert m.recorder.unconfirmed_total == 0
    await journal.close()
