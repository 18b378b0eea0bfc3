"""The recorder: the one place where a session's lifecycle becomes events and journal rows.

Event numbers are per session, from 1, without holes. With a journal, numbers are reserved in
blocks (journal.py) and an event whose number is not durably reserved yet is held back, so a
re-adopted session never reuses a number an earlier life may have published. A call that wants
its events durable before it answers waits at most ``confirm_timeout`` (:meth:`confirm`).
Journal writes happen in the journal's writer thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from collections.abc import Mapping
from typing import Any

from rlsandbox.daemon.events import model as ev
from rlsandbox.daemon.events.publisher import EventPublisher
from rlsandbox.daemon.grading.rewards import GradeResult
from rlsandbox.daemon.journal import SEQ_BLOCK, JournalEntry, SessionJournal
from rlsandbox.daemon.logs import context_field
from rlsandbox.daemon.model import ExecRequest, ExecResult
from rlsandbox.daemon.pool import HOST_OOM
from rlsandbox.daemon.session.state import Session, SessionState

log = logging.getLogger(__name__)
CREATED_EVENT = "created_event"  # the journal row's copy of the session's ``created`` event data
MAX_TESTS = 500  # per-test outcomes in a reward event (the event is cut to 256 KiB anyway)

JOURNAL_WAIT = 1.0  # seconds a step waits at most for its journal row (a stalled disk costs that, not an error)
STORM_WINDOW = 60.0  # seconds: a timeout storm is this many ...
STORM_THRESHOLD = 50  # ... timed-out commands within the window


class Recorder:
    """Events and journal rows of a node's sessions.

    Args:
        node_id: this node.
        sessions: the live sessions by id (the manager's table; read, never changed here).
        events: where events go; None: no events.
        journal: where READY sessions are recorded for re-adoption; None: none.
        output_cap: bytes of each stream put in step events (0: none).
        confirm_timeout: seconds a call waits at most for its events to be durable (0: never waits).
    """

    def __init__(
        self,
        node_id: str,
        sessions: Mapping[str, Session],
        *,
        events: EventPublisher | None,
        journal: SessionJournal | None,
        output_cap: int = 0,
        confirm_timeout: float = 0.25,
    ) -> None:
        self.node_id = node_id
        self.sessions = sessions
        self.events = events
        self.journal = journal
        self.output_cap = output_cap
        self.confirm_timeout = confirm_timeout
        self.unconfirmed_total = 0  # calls answered before their events were durable (bound hit)
        self._timeouts: collections.deque[float] = collections.deque()
        self._storm_alerted_at = 0.0
        if events is not None:
            events.on_durable = self._on_durable

    # -- the journal ----------------------------------------------------------------------------
    async def record(self, session: Session) -> None:
        """The session's journal row, durable when this returns (a crash right after re-adopts it)."""
        if self.journal is None or session.sandbox is None:
            return
        session.seq_reserved = session.event_seq + SEQ_BLOCK
        failures = self.journal.write_errors
        await self.journal.record(
            JournalEntry(
                session=session.id,
                pool=session.pool.name,
                container=session.sandbox.name,
                container_id=session.sandbox.container_id,
                transport=session.sandbox.transport,
                runtime=session.sandbox.runtime,
                image=session.sandbox.image,
                options={**session.options.journal_form(), CREATED_EVENT: self._created_data(session)},
                task_spec=session.options.task.spec_json() if session.options.task is not None else None,
                task_tar=session.options.task.workspace_tar if session.options.task is not None else b"",
                created_at=session.created_at,
                started_at=time.time() - (time.monotonic() - session.started),
                seq_reserved=session.seq_reserved,
                steps=session.steps,
                emitted=session.acked_seq,
                task_ref=session.options.task_ref,
            )
        )
        session.seq_durable = session.seq_reserved
        session.created_journaled = self.journal.write_errors == failures

    def forget(self, session_id: str) -> None:
        """The session is ending: its row goes (a restart must not re-adopt it)."""
        if self.journal is not None:
            self.journal.forget(session_id)

    async def readopted(self, session: Session, entry: JournalEntry) -> None:
        """A session re-adopted from ``entry``: reserve its next block durably, then say so."""
        if self.journal is not None:
            session.seq_reserved = session.event_seq + SEQ_BLOCK
            session.acked_seq = session.event_seq  # nothing of this life yet; below it, the window says
            await self.journal.progress(
                session.id, seq_reserved=session.seq_reserved, emitted=session.acked_seq, steps=session.steps, urgent=True
            )
            session.seq_durable = session.seq_reserved
        assert session.sandbox is not None
        self._created_again(entry)
        data = {"container": session.sandbox.name, "transport": session.sandbox.transport, "unused_seq_window": window(entry)}
        self.emit(session, ev.ADOPTED, data)

    def lost(self, entry: JournalEntry, reason: str) -> None:
        """A journalled session that cannot be re-adopted: its row goes, a ``failed`` event says why."""
        self.forget(entry.session)
        self._created_again(entry)
        if self.events is not None:
            labels = dict(entry.options.get("labels", {}))
            data = {"reason": reason, "steps": entry.steps, "unused_seq_window": window(entry)}
            self.events.emit(ev.Event(ev.FAILED, self.node_id, entry.session, entry.seq_reserved + 1, data, labels))

    # -- events ---------------------------------------------------------------------------------
    def emit(self, session: Session, type_: str, data: dict[str, Any]) -> None:
        if self.events is None:
            return
        session.event_seq += 1
        trace = context_field("trace")
        if trace:  # the call's trace (the trainer's traceparent, or the node's span): events join up with traces
            data["trace"] = trace
        event = ev.Event(type_, self.node_id, session.id, session.event_seq, data, dict(session.options.labels))
        if self.journal is not None and session.state is SessionState.READY:
            urgent = session.event_seq > session.seq_reserved - SEQ_BLOCK // 2
            if urgent:  # reserve the next block ahead of use
                session.seq_reserved = max(session.seq_reserved, session.event_seq) + SEQ_BLOCK
            durable = self.journal.progress(
                session.id, seq_reserved=session.seq_reserved, emitted=session.acked_seq, steps=session.steps, urgent=urgent
            )
            if session.event_seq > session.seq_durable:
                # Its number is not durably reserved yet: it waits (a next life could reuse it).
                if not session.awaiting_reservation:
                    session.awaiting_reservation = True
                    reserved = session.seq_reserved
                    durable.add_done_callback(functools.partial(self._on_reserved, session, reserved))
                session.held.append(event)
                return
        if session.held:
            session.held.append(event)  # behind the held ones, in order
            return
        self.events.emit(event)

    def _on_reserved(self, session: Session, durable: int, _: asyncio.Future[None]) -> None:
        """Emit the held events whose numbers are now durably reserved (all of them once the
        session's row is gone: nothing can be re-adopted to reuse them)."""
        session.awaiting_reservation = False
        session.seq_durable = max(session.seq_durable, durable)
        assert self.events is not None
        while session.held and (session.held[0].seq <= session.seq_durable or session.state is not SessionState.READY):
            self.events.emit(session.held.pop(0))
        if session.held and self.journal is not None:
            session.awaiting_reservation = True
            reserved = session.seq_reserved
            self.journal.progress(
                session.id, seq_reserved=reserved, emitted=session.acked_seq, steps=session.steps, urgent=True
            ).add_done_callback(functools.partial(self._on_reserved, session, reserved))

    def _on_durable(self, events: list[ev.Event]) -> None:
        """The publisher says these events are durable: wake the calls waiting for them."""
        top: dict[str, int] = {}
        for e in events:
            if e.session and e.seq > top.get(e.session, 0):
                top[e.session] = e.seq
        for sid, seq in top.items():
            session = self.sessions.get(sid)
            if session is None or seq <= session.acked_seq:
                continue
            session.acked_seq = seq
            waiting = session.durable_waiters
            if waiting:
                session.durable_waiters = [(n, f) for n, f in waiting if n > seq]
                for n, f in waiting:
                    if n <= seq and not f.done():
                        f.set_result(None)
            if self.journal is not None and session.state is SessionState.READY:
                self.journal.progress(sid, seq_reserved=session.seq_reserved, emitted=seq, steps=session.steps)

    def _created_again(self, entry: JournalEntry) -> None:
        """The ``created`` event of a session an earlier life answered CreateSession for without
        waiting for JetStream (:meth:`confirm_created`), published again from its journal row
        unless the row says it was acknowledged. If it was published after all, its message id
        (``<session>:1``) makes this copy a duplicate the stream and the aggregator drop."""
        data = entry.options.get(CREATED_EVENT)
        if self.events is None or entry.emitted >= 1 or not isinstance(data, dict):
            return
        labels = dict(entry.options.get("labels", {}))
        self.events.emit(ev.Event(ev.CREATED, self.node_id, entry.session, 1, dict(data), labels, ts=entry.created_at))

    async def confirm_created(self, session: Session) -> None:
        """CreateSession's wait for its events: none when the session's only event is ``created``
        and its journal row, durable before the hand-out, holds that event (a next life publishes
        it again: :meth:`_created_again`). Otherwise, as any call (:meth:`confirm`). A burst of
        hand-outs then never waits for a JetStream round trip (docs/events.md)."""
        if session.created_journaled and session.event_seq == 1:
            return
        await self.confirm(session)

    async def before_forget(self, session: Session) -> None:
        """A session ends: its journal row is about to go. If the row is still the only durable
        copy of its ``created`` event (:meth:`confirm_created`), wait for the event first (at most
        ``confirm_timeout``), or a crash right after would lose an answered call's event."""
        if session.created_journaled and session.acked_seq < 1:
            await self.confirm(session)

    async def confirm(self, session: Session) -> None:
        """Wait (at most ``confirm_timeout``) until the session's events so far are durable, so that
        what a caller was told cannot be missing from the events after a crash. A stalled NATS
        costs the call that bound, not an error; such calls are counted."""
        seq = session.event_seq
        if self.events is None or seq <= session.acked_seq or self.confirm_timeout <= 0:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        session.durable_waiters.append((seq, future))
        self.events.flush_soon()
        try:
            async with asyncio.timeout(self.confirm_timeout):
                await asyncio.shield(future)
        except TimeoutError:
            self.unconfirmed_total += 1

    # -- what each lifecycle change records -----------------------------------------------------
    def created(self, session: Session) -> None:
        self.emit(session, ev.CREATED, self._created_data(session))

    def _created_data(self, session: Session) -> dict[str, Any]:
        """The ``created`` event's data; the journal row keeps a copy (:meth:`_created_again`)."""
        assert session.sandbox is not None
        task = session.options.task
        data = {
            "pool": session.pool.name,
            "image": session.pool.spec.container.image,
            "mode": session.sandbox.mode,
            "container": session.sandbox.name,
            "task": task.id if task else None,
            "workdir": session.workdir,
        }
        if session.options.forked_from:
            data["forked_from"] = session.options.forked_from
        trace = context_field("trace")
        if trace:
            data["trace"] = trace
        return data

    async def stepped(self, session: Session, req: ExecRequest, result: ExecResult, seq: int) -> None:
        """A step ran: its event, the journal's step count, and both durable before the answer."""
        if self.events is not None:
            data: dict[str, Any] = {
                "argv": list(req.argv) if req.argv is not None else None,
                "shell": req.shell[:2000] if req.shell is not None else None,
                "shell_session": req.shell_session,
                "step_seq": seq or None,
                "exit_code": result.exit_code,
                "signal": result.signal,
                "timed_out": result.timed_out,
                "duration": round(result.duration, 6),
                "stdout_bytes": result.stdout_total,
                "stderr_bytes": result.stderr_total,
                "truncated": result.stdout_truncated or result.stderr_truncated,
            }
            if self.output_cap:
                data["stdout"] = result.stdout[: self.output_cap].decode("utf-8", errors="replace")
                data["stderr"] = result.stderr[: self.output_cap].decode("utf-8", errors="replace")
            self.emit(session, ev.STEP, data)
            if result.timed_out:
                self._timeout_storm()
        if self.journal is not None and self.events is not None and self.confirm_timeout > 0:
            # With events confirmed, the journal's step count is exact for every answered step
            # (the closed event after a re-adoption says it), written while the event is confirmed.
            row = self.journal.progress(
                session.id, seq_reserved=session.seq_reserved, emitted=session.acked_seq, steps=session.steps, urgent=True
            )
            await asyncio.gather(self.confirm(session), _within(row, JOURNAL_WAIT))
        else:
            await self.confirm(session)

    def files_written(self, session: Session, written: list[tuple[str, int]]) -> None:
        self.emit(session, ev.FILES, {"files": [{"path": p, "bytes": n} for p, n in written[:1000]], "count": len(written)})

    def graded(self, session: Session, task_id: str, result: GradeResult) -> None:
        self.emit(
            session,
            ev.REWARD,
            {
                "task": task_id,
                "status": result.status.value,
                "reward": result.reward,
                "resolved": result.resolved,
                "mode": result.mode,
                "counts": result.counts(),
                # Per test (the graded ones first, as the grader lists them), for the episode viewer.
                "tests": [{"id": t.id[:300], "outcome": t.outcome, "group": t.group.value} for t in result.tests[:MAX_TESTS]],
                "tampering": result.tampering[:50],
                "duration": round(result.duration, 6),
                "exit_code": result.exit_code,
                "message": result.message[:2000],
            },
        )
        if result.tampering:
            self.emit(session, ev.ALERT, {"kind": "tampering", "task": task_id, "details": result.tampering[:50]})

    def died(self, session: Session, cause: str, detail: str, whose: str = "") -> None:
        """The sandbox died; ``whose`` is :meth:`SandboxFactory.death_cause`'s (the episode's doing:
        "oom", "disk" or "tamper"; the node's: "host" for the host's OOM killer, "" otherwise)."""
        oom = whose == "oom"
        kind = {"oom": "oom_killed", "disk": "disk_exceeded", "tamper": "tampering", HOST_OOM: "host_oom_killed"}.get(
            whose, "sandbox_died"
        )
        alert = {"kind": kind, "reason": cause, "detail": detail, "oom_killed": oom}
        self.emit(session, ev.ALERT, alert)
        self.emit(session, ev.FAILED, {"reason": f"sandbox died: {cause}", "steps": session.steps, "oom_killed": oom})

    def closed(self, session: Session, reason: str) -> None:
        self.emit(session, ev.CLOSED, {"reason": reason, "steps": session.steps})

    def _timeout_storm(self) -> None:
        """A node alert when many commands time out at once (a hung dependency, an overloaded node)."""
        now = time.monotonic()
        self._timeouts.append(now)
        while self._timeouts and self._timeouts[0] < now - STORM_WINDOW:
            self._timeouts.popleft()
        if len(self._timeouts) >= STORM_THRESHOLD and now - self._storm_alerted_at > STORM_WINDOW and self.events is not None:
            self._storm_alerted_at = now
            self.events.emit_node(ev.ALERT, {"kind": "timeout_storm", "timeouts": len(self._timeouts), "window_s": STORM_WINDOW})


def window(entry: JournalEntry) -> list[int] | None:
    """Event numbers an earlier life did not journal as emitted: never used, or used in the last
    moment before it died (see journal.py); None when there are none."""
    return [entry.emitted + 1, entry.seq_reserved] if entry.emitted < entry.seq_reserved else None


async def _within(future: asyncio.Future[None], timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await asyncio.shield(future)
